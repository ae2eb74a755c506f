"""Checks real daemon responses against api/openapi.yaml.

The harness calls `check()` on every response it reads (cheap: the spec is
loaded and its schemas compiled once) and, when AIRLOCK_SPEC_RECORD names a
file, appends what it saw there as one JSON line, so the `spec.coverage`
test can later ask which statuses and error codes the whole suite produced.

OpenAPI 3.0 schemas are not quite JSON Schema: `nullable: true` is turned
into a `null` alternative here, and `$ref`s resolve against the spec itself.
Uses Debian's python3-yaml and python3-jsonschema (scripts/setup.sh).
"""

import copy
import json
import os
import threading
import warnings

import jsonschema
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPEC_PATH = os.path.join(ROOT, "api", "openapi.yaml")
METHODS = ("get", "put", "post", "delete", "patch")
# A stdout/stderr line of an exec stream can carry megabytes of base64; the
# record keeps a prefix (still valid base64) so the file stays small.
MAX_RECORDED_DATA = 4096

_lock = threading.Lock()
_cache = {}


def _to_json_schema(node):
    """OpenAPI 3.0 schema objects -> JSON Schema (draft 7), recursively."""
    if isinstance(node, list):
        return [_to_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _to_json_schema(v) for k, v in node.items() if k not in ("nullable", "example")}
    if node.get("nullable") is True:
        if "type" in out:
            out["type"] = [out["type"], "null"] if isinstance(out["type"], str) else out["type"] + ["null"]
        if "enum" in out:
            out["enum"] = list(out["enum"]) + [None]
    return out


def spec():
    """The spec as parsed YAML (cached)."""
    with _lock:
        if "spec" not in _cache:
            with open(SPEC_PATH) as f:
                _cache["spec"] = yaml.safe_load(f)
            _cache["root"] = _to_json_schema(copy.deepcopy(_cache["spec"]))
        return _cache["spec"]


def _validator(schema):
    """A compiled validator per schema object of the spec (cached: the
    harness checks every response, so this must stay cheap)."""
    spec()
    key = id(schema)
    with _lock:
        hit = _cache.get(("validator", key))
        if hit is not None and hit[0] is schema:
            return hit[1]
        with warnings.catch_warnings():
            # Newer jsonschema deprecates RefResolver; Debian's (4.10) has no
            # replacement yet. Both resolve the spec's local refs the same.
            warnings.simplefilter("ignore", DeprecationWarning)
            resolver = jsonschema.RefResolver.from_schema(_cache["root"])
        v = jsonschema.Draft7Validator(_to_json_schema(schema), resolver=resolver)
        _cache[("validator", key)] = (schema, v)
        return v


def schema_errors(schema, value):
    """Messages of every way `value` breaks the OpenAPI `schema` ([] = valid)."""
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
            for e in _validator(schema).iter_errors(value)]


def component(name):
    return spec()["components"]["schemas"][name]


def resolve(node):
    """Follows a local `$ref` (one level at a time until none is left)."""
    while isinstance(node, dict) and "$ref" in node:
        cur = spec()
        for part in node["$ref"].lstrip("#/").split("/"):
            cur = cur[part]
        node = cur
    return node


def operations():
    """[(METHOD, template, operation object)] for every operation in the spec."""
    ops = []
    for template, item in spec()["paths"].items():
        for method in METHODS:
            if method in item:
                ops.append((method.upper(), template, item[method]))
    return ops


def match_template(path):
    """The spec's path template matching a concrete path (query stripped), or None.
    `{x}` matches one non-empty segment; the template with most literals wins."""
    segs = path.split("?", 1)[0].split("/")
    best, best_literals = None, -1
    for template in spec()["paths"]:
        t = template.split("/")
        if len(t) != len(segs):
            continue
        literals = 0
        for a, b in zip(t, segs):
            if a.startswith("{") and a.endswith("}"):
                if not b:
                    break
            elif a != b:
                break
            else:
                literals += 1
        else:
            if literals > best_literals:
                best, best_literals = template, literals
    return best


def _response_for(op, status):
    responses = op.get("responses", {})
    if str(status) in responses:
        return resolve(responses[str(status)])
    # `default` stands for the 5xx answers, the 408 of a stalled request and
    # the TCP listener's 401 (no valid token) and 429 (auth failures).
    if "default" in responses and (status >= 500 or status in (408, 401, 429)):
        return resolve(responses["default"])
    return None


def check(method, template, status, content_type, body):
    """Problems (strings) with one response; [] when it matches the spec.

    `body` is the parsed JSON, a list of parsed NDJSON lines, None for an
    empty body, or bytes for a raw (octet-stream) body."""
    problems = []
    media = (content_type or "").split(";")[0].strip()
    item = spec()["paths"].get(template) if template else None
    op = item.get(method.lower()) if item else None
    if op is None:
        # No route (404; also on a documented path for a method the daemon
        # does not serve at all) or no such method on a served path (405).
        expect = {404: "NotFound", 405: "MethodNotAllowed"}.get(status)
        if not expect or (template is None and status == 405):
            return [f"{method} {template}: no such operation in the spec (status {status})"]
        resp = resolve(spec()["components"]["responses"][expect])
    else:
        resp = _response_for(op, status)
        if resp is None:
            return [f"{method} {template}: status {status} is not documented"]
    content = resp.get("content")
    if not content:
        if body not in (None, b"", [], ""):
            problems.append(f"{method} {template} {status}: documented without a body, got one")
        return problems
    if media not in content:
        return [f"{method} {template} {status}: content type {media!r} not documented "
                f"(documented: {sorted(content)})"]
    schema = content[media].get("schema", {})
    if media == "application/x-ndjson":
        for i, line in enumerate(body or []):
            problems += [f"{method} {template} {status} line {i}: {e}" for e in schema_errors(schema, line)]
    elif media == "application/json":
        problems += [f"{method} {template} {status}: {e}" for e in schema_errors(schema, body)]
    return problems


def error_codes(body):
    """The error codes a response body carries (an Error, or NDJSON lines with one)."""
    items = body if isinstance(body, list) else [body]
    codes = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("error"), dict):
            codes.append(item["error"].get("code"))
    return codes


def _slim(line):
    if isinstance(line, dict) and isinstance(line.get("data"), str) and len(line["data"]) > MAX_RECORDED_DATA:
        line = dict(line, data=line["data"][:MAX_RECORDED_DATA])
    return line


def record(method, path, status, content_type, body):
    """Appends one response to $AIRLOCK_SPEC_RECORD (if set), one JSON line,
    written with a single O_APPEND write so concurrent suites do not interleave."""
    target = os.environ.get("AIRLOCK_SPEC_RECORD")
    if not target:
        return
    if isinstance(body, (bytes, bytearray)):
        body = {"raw_bytes": len(body)}
    elif isinstance(body, list) and (content_type or "").startswith("application/x-ndjson"):
        body = [_slim(b) for b in body]
    entry = {"method": method, "path": path.split("?", 1)[0], "route": match_template(path),
             "status": status, "content_type": (content_type or "").split(";")[0].strip(),
             "body": body}
    data = (json.dumps(entry) + "\n").encode()
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def observe(method, path, status, content_type, body):
    """Records a response and raises AssertionError if it breaks the spec
    (unless AIRLOCK_SPEC_CHECK=0)."""
    record(method, path, status, content_type, body)
    if os.environ.get("AIRLOCK_SPEC_CHECK", "1") == "0":
        return
    if isinstance(body, (bytes, bytearray)) and not (content_type or "").startswith("application/octet-stream"):
        return  # unparseable JSON is reported by the test that reads it
    problems = check(method, match_template(path), status, content_type, body)
    if problems:
        raise AssertionError("response does not match api/openapi.yaml:\n  " + "\n  ".join(problems))
