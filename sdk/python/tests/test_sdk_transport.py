"""The SDK's transport rules that need no daemon: a token never goes over
plain http to another machine. Nothing here opens a connection (connect()
is replaced by a failure), so a broken refusal cannot reach the network."""

import http.client
import os
import socket
import unittest
from unittest import mock

from sdk_harness import SDK_DIR  # noqa: F401  (sets sys.path)

import airlock
from airlock import Client, InvalidArgument


def _no_connect(*args, **kwargs):
    raise AssertionError("the SDK tried to connect")


class TokenOverPlainHttpTest(unittest.TestCase):
    def setUp(self):
        for target in (http.client.HTTPConnection, http.client.HTTPSConnection):
            patcher = mock.patch.object(target, "connect", _no_connect)
            patcher.start()
            self.addCleanup(patcher.stop)
        patcher = mock.patch.object(socket, "create_connection", _no_connect)
        patcher.start()
        self.addCleanup(patcher.stop)
        env = mock.patch.dict(os.environ, {}, clear=False)
        env.start()
        self.addCleanup(env.stop)
        for k in ("AIRLOCK_URL", "AIRLOCK_TOKEN", "AIRLOCK_CA"):
            os.environ.pop(k, None)

    def test_refused_for_a_remote_host_naming_the_url(self):
        for url in ("http://192.0.2.7:8080", "http://sandbox.example:80",
                    "http://[2001:db8::1]:8080", "http://127.0.0.1.example:80"):
            with self.assertRaises(InvalidArgument) as e:
                Client(url=url, token="airlock_" + "0" * 40)
            self.assertIn(url, str(e.exception), url)
            self.assertIn("https", str(e.exception), url)
            self.assertEqual(e.exception.field, "url")

    def test_refused_from_the_environment_too(self):
        os.environ.update(AIRLOCK_URL="http://192.0.2.7:8080", AIRLOCK_TOKEN="airlock_" + "1" * 40)
        with self.assertRaises(InvalidArgument):
            Client()

    def test_https_loopback_and_no_token_are_fine(self):
        for url in ("https://192.0.2.7:8443", "http://127.0.0.1:8080", "http://127.9.0.1:1",
                    "http://[::1]:8080", "http://localhost:8080"):
            Client(url=url, token="airlock_" + "0" * 40).close()
        Client(url="http://192.0.2.7:8080").close()  # no token: nothing to leak
        self.assertTrue(issubclass(InvalidArgument, airlock.AirlockError))


if __name__ == "__main__":
    unittest.main()
