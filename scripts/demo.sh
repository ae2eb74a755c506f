#!/bin/sh
# `make run`: a real sandbox session, as a user would type it.
# The CLI starts a daemon on first use (data under /var/lib/airlock as root,
# else under the user's data directory).
set -eu
AIRLOCK=${AIRLOCK:-build/bin/airlock}
IMAGE=${IMAGE:-debian}

say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }

say airlock image build "$IMAGE"
$AIRLOCK image build "$IMAGE"

say airlock info
$AIRLOCK info

say airlock create --image "$IMAGE" --memory 512 --timeout 600
ID=$($AIRLOCK create --image "$IMAGE" --memory 512 --timeout 600)
echo "$ID"
trap '$AIRLOCK rm "$ID" >/dev/null 2>&1 || true' EXIT

say airlock exec "$ID" -- python3 -c "import platform, sys; print('python', sys.version.split()[0], 'on kernel', platform.release())"
$AIRLOCK exec "$ID" -- python3 -c "import platform, sys; print('python', sys.version.split()[0], 'on kernel', platform.release())"

say "echo 'hello from the host' | airlock cp - $ID:/root/hello.txt"
echo 'hello from the host' | $AIRLOCK cp - "$ID:/root/hello.txt"

say airlock exec "$ID" -- sh -c "cat /root/hello.txt; echo written in the guest > /root/reply.txt"
$AIRLOCK exec "$ID" -- sh -c "cat /root/hello.txt; echo written in the guest > /root/reply.txt"

say airlock cp "$ID:/root/reply.txt" -
$AIRLOCK cp "$ID:/root/reply.txt" -

say airlock exec "$ID" -- sh -c "echo failing on purpose >&2; exit 7"
set +e
$AIRLOCK exec "$ID" -- sh -c "echo failing on purpose >&2; exit 7"
echo "exit code: $?"
set -e

say airlock ls
$AIRLOCK ls

say airlock rm --wait "$ID"
$AIRLOCK rm --wait "$ID"
trap - EXIT

say airlock logs "$ID"
$AIRLOCK logs "$ID"

# The first create of a shape saved a template; the next one is a
# copy-on-write clone of it (start: clone) instead of a boot.
say "time airlock run --image $IMAGE --memory 512 -- cat /etc/machine-id   # a clone: own identity"
start=$(date +%s%N)
$AIRLOCK run --image "$IMAGE" --memory 512 -- cat /etc/machine-id
echo "create + exec + destroy: $(( ($(date +%s%N) - start) / 1000000 )) ms"

# The same daemon from Python: the SDK in sdk/python, straight from the tree.
say "python3 -c 'from airlock import Sandbox; ...'   # the Python SDK"
PYTHONPATH=sdk/python python3 - "$IMAGE" <<'PY'
import sys
from airlock import Sandbox
with Sandbox.create(image=sys.argv[1], memory_mb=512, timeout=600) as sb:
    sb.files.write("/root/a.txt", b"written by the SDK\n")
    r = sb.exec("sh", "-c", "cat /root/a.txt; echo 6*7=$((6*7))")
    print(r.stdout.decode(), end="")
    print("exit code:", r.exit_code, "- sandbox", sb.id, "is destroyed on leaving the with block")
PY
