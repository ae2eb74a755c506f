"""The responses recorded during the integration suites, against the spec.

ctest runs this last (`spec.coverage`, after every suite; `spec.record_reset`
empties the record first). The harness appended every response it read to
$AIRLOCK_SPEC_RECORD; here each must validate against api/openapi.yaml, and
every status each operation documents and every error code the Error schema
lists must have been produced by some test. Run alone it reads the record the
last full run left.
"""

import json
import os
import unittest

import openapi_check
from test_spec import PENDING

RECORD = os.environ.get("AIRLOCK_SPEC_RECORD", "")

# Error codes no test can produce honestly. Each needs a reason; keep short.
UNPRODUCIBLE_CODES = {
    "internal": "airlock's own bug or host failure: a test that provokes one has found a bug",
    "protocol_error": "needs a guest agent that breaks the frame protocol; the images run the real agent "
                      "(covered by the channel's unit tests and fuzzers)",
}


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


@unittest.skipUnless(RECORD, "AIRLOCK_SPEC_RECORD is not set (ctest sets it for every integration suite)")
class SpecCoverageTest(unittest.TestCase):
    maxDiff = None

    @classmethod
    def setUpClass(cls):
        cls.entries = load(RECORD) if os.path.exists(RECORD) else []

    def test_record_is_not_empty(self):
        self.assertGreater(len(self.entries), 100, f"{RECORD}: run the integration suites first")

    def test_every_recorded_response_matches_the_spec(self):
        problems = []
        for e in self.entries:
            body = e["body"]
            if isinstance(body, dict) and set(body) == {"raw_bytes"}:
                body = b""  # a raw body: only its status and content type are checked
            for p in openapi_check.check(e["method"], e["route"], e["status"], e["content_type"], body):
                problems.append(f"{p}  [{e['path']}]")
        self.assertEqual(problems[:50], [], f"{len(problems)} responses do not match the spec")

    def test_every_documented_status_was_produced(self):
        seen = {(e["method"], e["route"], str(e["status"])) for e in self.entries}
        missing = []
        for method, template, op in openapi_check.operations():
            if (method, template) in PENDING:
                continue
            for status in op["responses"]:
                if status != "default" and (method, template, status) not in seen:
                    missing.append(f"{method} {template} {status}")
        self.assertEqual(missing, [], "documented statuses no test produced")

    def test_every_error_code_was_produced(self):
        seen = set()
        for e in self.entries:
            seen.update(openapi_check.error_codes(e["body"]))
        enum = openapi_check.component("Error")["properties"]["error"]["properties"]["code"]["enum"]
        missing = sorted(set(enum) - seen - set(UNPRODUCIBLE_CODES))
        self.assertEqual(missing, [], "error codes no test produced")
        # An exemption that is produced after all is no longer needed.
        self.assertEqual(sorted(set(UNPRODUCIBLE_CODES) & seen), [],
                         "produced now: delete from UNPRODUCIBLE_CODES")


if __name__ == "__main__":
    unittest.main()
