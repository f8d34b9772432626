"""The client: its event-stream parser and reconnection against a stub server,
then submit, follow, outputs, resubmit, bad input, decide and cancel against a
live `toolwire dev` (devserver.py), each on a scripted run.

Run: python3 -m unittest discover -s clients/python -v"""

from __future__ import annotations

import itertools
import json
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from devserver import DevServer
from toolwire_client import Client, SSEMessage, ToolwireError, end_status, parse_sse

APPROVAL_REQUIRED = "dev.toolwire.call.approval_required.v1"
CALL_COMPLETED = "dev.toolwire.call.completed.v1"
_ids = itertools.count()


def echo_run(text: str, approval: bool = False) -> dict:
    """A run whose scripted model calls echo once with text, then answers "done"."""
    policy: dict = {"max_iterations": 5}
    if approval:
        policy.update(require_approval={"tools": ["echo"]}, approval_timeout_s=600)
    return {
        "run_id": f"py-{int(time.time() * 1000):x}-{next(_ids)}",
        "agent": {
            "name": "client-tests",
            "model": {
                "provider": "scripted",
                "name": "script-1",
                "options": {"script": [{"tool_calls": [{"name": "echo", "arguments": {"text": text}}]}, {"content": "done"}]},
            },
            "enabled_tools": ["echo@1.0.0"],
            "policy": policy,
        },
        "messages": [{"role": "user", "content": f"echo {text}"}],
    }


def ce(id_: str, type_: str) -> dict:
    return {"specversion": "1.0", "id": id_, "source": "/test", "type": type_, "runid": "r1", "data": {}}


class SSETest(unittest.TestCase):
    def test_parse(self):
        lines = [b"retry: 2000\n", b"\n", b": keep-alive\n", b"\n", b"id: 1\n", b'data: {"a":1}\n', b"\n",
                 b"id: 2\r\n", b"data: x\r\n", b"data: y\r\n", b"\r\n", b"event: end\n", b"data: {}\n", b"\n",
                 b"id: 9\n", b"data: cut\n"]
        self.assertEqual(list(parse_sse(iter(lines))), [
            SSEMessage("message", "", None, 2000),
            SSEMessage("message", '{"a":1}', "1"),
            SSEMessage("message", "x\ny", "2"),
            SSEMessage("end", "{}"),
        ])

    def _serve(self, handle):
        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                handle(self)

            def log_message(self, *a):
                pass

        srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    def test_follow_reconnects_with_last_event_id(self):
        seen = []

        def handle(h):
            seen.append((h.headers.get("Authorization"), h.headers.get("Last-Event-ID")))
            h.send_response(200)
            h.send_header("Content-Type", "text/event-stream")
            h.send_header("Connection", "close")
            h.end_headers()
            if len(seen) == 1:
                h.wfile.write(b"retry: 10\n\n")
                for i, t in ((1, "requested"), (2, "started")):
                    h.wfile.write(f"id: {i}\ndata: {json.dumps(ce('r1/' + t, f'dev.toolwire.run.{t}.v1'))}\n\n".encode())
                h.wfile.flush()
                return  # the connection drops mid-run
            h.wfile.write(f"id: 3\ndata: {json.dumps(ce('r1/completed', 'dev.toolwire.run.completed.v1'))}\n\n".encode())
            h.wfile.flush()
            time.sleep(0.5)  # still open: follow ends by itself at the end event

        c = Client(self._serve(handle), token="tw_x", retry_s=0.01)
        f = c.follow("r1")
        self.assertEqual([e["id"] for e in f], ["r1/requested", "r1/started", "r1/completed"])
        self.assertEqual(seen, [("Bearer tw_x", None), ("Bearer tw_x", "2")])
        self.assertEqual(f.last_event_id, "3")
        self.assertEqual(end_status(f.end), "completed")

    def test_follow_hands_deltas_over_once(self):
        seen = []

        def delta(it, seq, **kw):
            d = {"run_id": "r1", "iteration": it, "attempt": 1, "seq": seq, **kw}
            return f"event: delta\ndata: {json.dumps(d)}\n\n".encode()

        def handle(h):
            seen.append(h.headers.get("Last-Event-ID"))
            h.send_response(200)
            h.send_header("Content-Type", "text/event-stream")
            h.send_header("Connection", "close")
            h.end_headers()
            h.wfile.write(b"retry: 10\n\n")
            if len(seen) == 1:
                h.wfile.write(f"id: 1\ndata: {json.dumps(ce('r1/requested', 'dev.toolwire.run.requested.v1'))}\n\n".encode())
            h.wfile.write(delta(1, 1, text="Hel") + delta(1, 2, text="lo"))
            if len(seen) == 1:
                h.wfile.flush()
                return  # drops mid-turn: the reconnection sends the held deltas again
            h.wfile.write(b"event: delta\ndata: {not json\n\n")
            h.wfile.write(delta(1, 3, tool_call={"index": 0, "id": "c1", "name": "echo"}))
            h.wfile.write(f"id: 2\ndata: {json.dumps(ce('r1/completed', 'dev.toolwire.run.completed.v1'))}\n\n".encode())
            h.wfile.flush()
            time.sleep(0.5)

        got = []
        c = Client(self._serve(handle), retry_s=0.01)
        f = c.follow("r1", on_delta=got.append)
        self.assertEqual([e["id"] for e in f], ["r1/requested", "r1/completed"])
        self.assertEqual([(d["seq"], d.get("text"), d.get("tool_call", {}).get("name")) for d in got],
                         [(1, "Hel", None), (2, "lo", None), (3, None, "echo")])
        self.assertEqual(seen, [None, "1"], "deltas do not move the resume point")
        self.assertEqual(f.last_event_id, "2")

    def test_follow_raises_the_api_error_at_once(self):
        hits = []

        def handle(h):
            hits.append(1)
            body = json.dumps({"error": {"code": "unauthorized", "message": "authentication required"}}).encode()
            h.send_response(401)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)

        c = Client(self._serve(handle), retry_s=0.01)
        with self.assertRaises(ToolwireError) as cm:
            list(c.follow("r1"))
        self.assertEqual((cm.exception.status, cm.exception.code), (401, "unauthorized"))
        self.assertEqual(len(hits), 1)

    def test_follow_stops_at_end_and_raises_the_error_event(self):
        def handle(h):
            h.send_response(200)
            h.send_header("Content-Type", "text/event-stream")
            h.send_header("Connection", "close")
            h.end_headers()
            if "/runs/r1/" in h.path:
                h.wfile.write(f": waiting\n\nid: 7\ndata: {json.dumps(ce('r1/started', 'dev.toolwire.run.started.v1'))}\n\n".encode())
                h.wfile.write(b'event: end\ndata: {"run_id":"r1","status":"completed"}\n\n')
            else:
                h.wfile.write(b'event: error\ndata: {"error":{"code":"run_not_found","message":"not recorded"}}\n\n')

        c = Client(self._serve(handle), retry_s=0.01)
        f = c.follow("r1")
        self.assertEqual([e["id"] for e in f], ["r1/started"])
        self.assertIsNone(f.end)
        with self.assertRaises(ToolwireError) as cm:
            list(c.follow("r2"))
        self.assertEqual(cm.exception.code, "run_not_found")

    def test_follow_gives_up(self):
        c = Client("http://127.0.0.1:1", retry_s=0.001, max_retries=2)
        with self.assertRaisesRegex(ToolwireError, "3 times in a row"):
            list(c.follow("r1"))


class LiveTest(unittest.TestCase):
    dev: DevServer
    c: Client

    @classmethod
    def setUpClass(cls):
        cls.dev = DevServer().__enter__()
        cls.c = Client(cls.dev.url, token=cls.dev.token, timeout=20, retry_s=0.2)

    @classmethod
    def tearDownClass(cls):
        cls.dev.__exit__(None, None, None)

    def until(self, it, type_):
        for e in it:
            if e["type"] == type_:
                return e
            if end_status(e):
                self.fail(f"run ended {end_status(e)} before {type_}")
        self.fail(f"the stream ended before {type_}")

    def test_submit_then_wait_for_outputs(self):
        req = echo_run("waited")
        self.assertTrue(self.c.submit(req).created)
        out = self.c.outputs(req["run_id"], wait_s=30)
        self.assertEqual(out["response"], "done")
        self.assertEqual(len(out["tool_order"]), 1)
        self.assertEqual(out["tools_by_id"][out["tool_order"][0]]["output"], {"text": "waited"})
        with self.assertRaises(ValueError):
            self.c.outputs(req["run_id"], wait_s=120)

    def test_submit_follow_outputs(self):
        req = echo_run("hello")
        sub = self.c.submit(req)
        self.assertEqual((sub.run_id, sub.created), (req["run_id"], True))
        f = self.c.follow(req["run_id"])
        seen = list(f)
        self.assertEqual(seen[-1]["type"], "dev.toolwire.run.completed.v1", [e["type"] for e in seen])
        self.assertEqual(seen[0]["type"], "dev.toolwire.run.requested.v1")
        self.assertIs(f.end, seen[-1])
        for e in seen:
            self.assertEqual(e["specversion"], "1.0")
            self.assertEqual(e["runid"], req["run_id"])
        call = next(e for e in seen if e["type"] == CALL_COMPLETED)
        out = self.c.outputs(req["run_id"])
        self.assertEqual(out["response"], "done")
        self.assertEqual(out["tool_order"], [call["callid"]])
        self.assertEqual(out["tools_by_id"][call["callid"]]["output"], {"text": "hello"})
        run = self.c.get(req["run_id"])
        self.assertEqual(run["status"], "completed")
        self.assertEqual(run["tenant"]["org_id"], "acme", "the token's tenant, as the request named none")
        rest = list(self.c.follow(req["run_id"], last_event_id=f.last_event_id, until_settled=True))
        self.assertFalse({e["id"] for e in rest} & {e["id"] for e in seen}, "resuming repeats no event")

    def test_resubmit(self):
        req = echo_run("twice")
        first, second = self.c.submit(req), self.c.submit(req)
        self.assertTrue(first.created)
        self.assertFalse(second.created)
        self.assertEqual(second.run_id, first.run_id)
        other = dict(req, messages=[{"role": "user", "content": "something else"}])
        with self.assertRaises(ToolwireError) as cm:
            self.c.submit(other)
        self.assertEqual((cm.exception.status, cm.exception.code), (409, "run_id_in_use"))
        self.assertEqual(self.c.wait(req["run_id"])["type"], "dev.toolwire.run.completed.v1")

    def refused(self, status, code, fn, *args):
        with self.assertRaises(ToolwireError) as cm:
            fn(*args)
        self.assertEqual((cm.exception.status, cm.exception.code), (status, code), str(cm.exception))
        return cm.exception

    def test_bad_input(self):
        err = self.refused(422, "invalid_request", self.c.submit, dict(echo_run("x"), run_id="not a run id!"))
        self.assertIn("run_id", json.dumps(err.details), "details point at the field")
        self.refused(422, "invalid_request", self.c.submit, dict(echo_run("x"), messages=[]))
        self.refused(400, "unknown_field", self.c.submit, dict(echo_run("x"), colour="blue"))
        self.refused(403, "tenant_mismatch", self.c.submit, dict(echo_run("x"), tenant={"org_id": "someone-else"}))
        self.refused(404, "run_not_found", self.c.get, "no-such-run")
        self.refused(404, "run_not_found", self.c.cancel, "no-such-run")
        self.refused(401, "unauthorized", Client(self.dev.url).submit, echo_run("x"))

    def test_decide_approve(self):
        req = echo_run("approved", approval=True)
        self.c.submit(req)
        f = self.c.follow(req["run_id"])
        it = iter(f)
        waiting = self.until(it, APPROVAL_REQUIRED)
        d = self.c.decide(req["run_id"], waiting["callid"], "approve", "fine by the tests")
        self.assertEqual((d.run_id, d.call_id, d.decision), (req["run_id"], waiting["callid"], "approve"))
        self.assertEqual(self.until(it, CALL_COMPLETED)["callid"], waiting["callid"])
        for _ in it:
            pass
        self.assertEqual(end_status(f.end), "completed")
        self.assertEqual(self.c.outputs(req["run_id"])["tools_by_id"][waiting["callid"]]["output"], {"text": "approved"})
        self.refused(409, "already_decided", self.c.decide, req["run_id"], waiting["callid"], "deny")
        self.refused(404, "call_not_found", self.c.decide, req["run_id"], "abcdef", "approve")

    def test_cancel(self):
        req = echo_run("never", approval=True)
        self.c.submit(req)
        # Bounded: the run must end on its cancel, not at its approval's timeout (600 s).
        f = self.c.follow(req["run_id"], timeout_s=60)
        it = iter(f)
        self.until(it, APPROVAL_REQUIRED)
        res = self.c.cancel(req["run_id"], "the tests cancel it")
        self.assertEqual((res.status, res.cancelled), ("cancelling", True))
        for _ in it:
            pass
        self.assertEqual(end_status(f.end), "cancelled")
        again = self.c.cancel(req["run_id"])
        self.assertEqual((again.status, again.cancelled), ("cancelled", False))


if __name__ == "__main__":
    unittest.main()
