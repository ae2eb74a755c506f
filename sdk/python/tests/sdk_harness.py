"""Puts the SDK (from this tree) and the integration harness on sys.path.

The SDK tests reuse tests/integration/harness.py's DaemonTestCase: one real
airlockd per test class on a private data dir and socket, real VMs.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SDK_DIR = os.path.dirname(HERE)
ROOT = os.path.dirname(os.path.dirname(SDK_DIR))
sys.path.insert(0, SDK_DIR)
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))

import harness  # noqa: E402

DaemonTestCase = harness.DaemonTestCase
