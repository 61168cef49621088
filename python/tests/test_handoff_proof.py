"""The handoff client sends te-sidecar's token derived from the cluster
secret only to a server that proves it holds the secret
(GET /metadata/proof?nonce=N, SECURITY.md "The token"): a plain HTTP server
given as the sidecar gets no Authorization header and the declaration fails
with AuthError; te-sidecar with the same secret gets the token and takes the
declaration; te-sidecar with another secret gets no token."""

import hashlib
import hmac
import http.server
import json
import os
import threading
import unittest

from handoff_proof_peer import declare
from sidecar import Sidecar
from util import Peer

SECRET = "python-handoff-proof-secret-0001"
OTHER = "python-handoff-proof-secret-0002"


def proof(secret, nonce, instance):
    """te-sidecar's proof, computed here from the documented formula."""
    key = hmac.new(secret.encode(), b"te-sidecar-proof v1", hashlib.sha256).digest()
    return hmac.new(key, (nonce + "\n" + instance).encode(), hashlib.sha256).hexdigest()


class Recorder:
    """A plain HTTP server on 127.0.0.1 that notes each request's path and
    Authorization header and answers with answer(path, query)."""

    def __init__(self, answer):
        seen = self.seen = []

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self):
                path, _, query = self.path.partition("?")
                seen.append((path, self.headers.get("Authorization")))
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                status, body = answer(path, query)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = _any

            def log_message(self, *args):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        self.addr = "127.0.0.1:%d" % self.srv.server_address[1]
        self.thread = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.srv.shutdown()
        self.srv.server_close()


def run_client(addr):
    """Declares a transfer at addr from a fresh process with the secret."""
    p = Peer(declare, addr, timeout=60, env={"TE_AUTH_SECRET": SECRET})
    try:
        return p.recv()
    finally:
        p.close()


class HandoffProofTest(unittest.TestCase):
    def assert_refused(self, got, url, why):
        self.assertEqual(got[0], "error", got)
        self.assertEqual(got[1], "AuthError", got)
        for part in (f"sidecar {url} did not prove it holds the cluster secret", why, "the sidecar token is not sent"):
            self.assertIn(part, got[2])

    def test_plain_server_gets_no_token(self):
        for name, answer, why in [
            ("404", lambda path, q: (404, b'{"error":"not found"}'), "answered HTTP 404"),
            ("200 to everything", lambda path, q: (200, b'{"instance":"x"}'), "does not match"),
            ("another secret", lambda path, q: (200, json.dumps({
                "instance": "i", "proofs": [proof(OTHER, q.partition("nonce=")[2], "i")]}).encode()), "does not match"),
        ]:
            with self.subTest(name):
                r = Recorder(answer)
                try:
                    got = run_client(r.addr)
                finally:
                    r.stop()
                self.assert_refused(got, "http://" + r.addr, why)
                self.assertEqual(len(r.seen), 1, r.seen)
                self.assertEqual(r.seen[0], ("/metadata/proof", None))

    def test_the_proof_formula(self):
        # The server above that proves its own secret is only a test if the
        # formula is te-sidecar's: a server proving SECRET is accepted and
        # gets the token (then answers what no sidecar would).
        def answer(path, q):
            if path == "/metadata/proof":
                return 200, json.dumps({"instance": "i", "proofs": [proof(SECRET, q.partition("nonce=")[2], "i")]}).encode()
            return 500, b'{"error":"not a sidecar","code":1}'
        r = Recorder(answer)
        try:
            got = run_client(r.addr)
        finally:
            r.stop()
        self.assertEqual(got[0], "error", got)
        self.assertNotEqual(got[1], "AuthError", got)
        self.assertEqual(r.seen[0], ("/metadata/proof", None))
        self.assertTrue(any(p == "/handoff/expect" and (a or "").startswith("Bearer ") for p, a in r.seen[1:]), r.seen)

    def _sidecar(self, secret):
        saved = os.environ.get("TE_AUTH_SECRET")
        os.environ["TE_AUTH_SECRET"] = secret  # for the sidecar process only
        try:
            return Sidecar()
        finally:
            if saved is None:
                os.environ.pop("TE_AUTH_SECRET", None)
            else:
                os.environ["TE_AUTH_SECRET"] = saved

    def test_sidecar_with_the_secret(self):
        sc = self._sidecar(SECRET)
        try:
            self.assertEqual(run_client(sc.addr), ("ok",))
        finally:
            sc.stop()

    def test_sidecar_with_another_secret(self):
        sc = self._sidecar(OTHER)
        try:
            got = run_client(sc.addr)
        finally:
            sc.stop()
        self.assert_refused(got, "http://" + sc.addr, "does not match")


if __name__ == "__main__":
    unittest.main()
