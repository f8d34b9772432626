"""toolwire's HTTP API from Python, with the standard library only.

Submit a run, follow its events live (Server-Sent Events, resumed with
Last-Event-ID when the connection drops), cancel it, decide on a call that
waits for an approval, read the run and its outputs. The routes and bodies
are those of the recorder's OpenAPI document,
services/recorder/api/openapi.yaml::

    from toolwire_client import Client

    c = Client("http://127.0.0.1:8088", token="tw_...")
    run = c.submit({"run_id": "run-1", "agent": {...}, "messages": [...]})
    for event in c.follow(run.run_id):
        print(event["type"])
    print(c.outputs(run.run_id)["response"])

Copy this one file into a project, or put its folder on sys.path.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Literal, Optional, TypedDict

__all__ = [
    "END_TYPES",
    "AgentOutputs",
    "CancelResult",
    "Client",
    "CloudEvent",
    "DecisionResult",
    "Follower",
    "RunRequest",
    "SSEMessage",
    "Submitted",
    "ToolwireError",
    "end_status",
    "parse_sse",
]

#: The event types that end a run: exactly one of them is a run's last.
END_TYPES = frozenset(
    {
        "dev.toolwire.run.completed.v1",
        "dev.toolwire.run.failed.v1",
        "dev.toolwire.run.cancelled.v1",
    }
)

Decision = Literal["approve", "deny", "revise"]


class Tenant(TypedDict, total=False):
    org_id: str
    workspace_id: str
    user_id: str


class RunRequest(TypedDict, total=False):
    """A run request (pkg/envelope/schemas/run_request.schema.json).

    ``tenant`` may be left out: the token's tenant is used.
    """

    run_id: str
    tenant: Tenant
    agent: Dict[str, Any]
    messages: List[Dict[str, Any]]
    metadata: Dict[str, str]
    deadline_s: int


class CloudEvent(TypedDict, total=False):
    """A CloudEvent 1.0 in JSON structured format, as the live stream carries each event."""

    specversion: str
    id: str
    source: str
    type: str
    time: str
    datacontenttype: str
    dataschema: str
    subject: str
    data: Any
    runid: str
    callid: str
    tenantid: str


class AgentOutputs(TypedDict, total=False):
    """The run's AgentOutputs (pkg/envelope/schemas/agent_outputs.schema.json)."""

    response: str
    tools_by_id: Dict[str, Dict[str, Any]]
    tool_order: List[str]
    last_tool: Dict[str, Any]
    traces_url: str


@dataclass(frozen=True)
class Submitted:
    """The answer to a submit: created is False for the same request again."""

    run_id: str
    status: str
    created: bool


@dataclass(frozen=True)
class CancelResult:
    """The answer to a cancel: cancelled is False when the run had ended already (status is its end)."""

    run_id: str
    status: str
    cancelled: bool


@dataclass(frozen=True)
class DecisionResult:
    run_id: str
    call_id: str
    decision: str


@dataclass(frozen=True)
class SSEMessage:
    """One dispatched message of an event stream."""

    event: str = "message"
    data: str = ""
    id: Optional[str] = None
    retry: Optional[int] = None


class ToolwireError(Exception):
    """A request the API refused (status, its stable code), or that could not be made (status 0)."""

    def __init__(self, status: int, code: str, message: str, details: Any = None, final: bool = False):
        super().__init__(f"{code}: {message}" if code else message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        #: The stream's own error event: following again would not change it.
        self.final = final


def end_status(event: CloudEvent) -> Optional[str]:
    """The status a run's end event stands for (completed, failed, cancelled), or None."""
    t = event.get("type", "")
    return t.split(".")[3] if t in END_TYPES else None


def parse_sse(lines: Iterator[bytes]) -> Iterator[SSEMessage]:
    """Yields the messages of an event stream, given its lines as bytes.

    As the HTML standard's event stream interpretation says: a line starting
    with ':' is a comment, 'field: value' drops one leading space, an empty
    line dispatches; a stream that ends mid-message drops that message.
    """
    data: List[str] = []
    event, mid, retry, seen = "", None, None, False
    for raw in lines:
        line = raw.decode("utf-8").rstrip("\r\n")
        if line == "":
            if seen:
                yield SSEMessage(event or "message", "\n".join(data), mid, retry)
            data, event, mid, retry, seen = [], "", None, None, False
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            data.append(value)
            seen = True
        elif field == "event":
            event, seen = value, True
        elif field == "id" and "\0" not in value:
            mid, seen = value, True
        elif field == "retry" and value.isdigit():
            retry, seen = int(value), True


class Follower:
    """The live events of a run; iterate it. lastEventId resumes, end is the run's end event."""

    def __init__(
        self,
        client: "Client",
        run_id: str,
        last_event_id: Optional[str],
        until_settled: bool,
        timeout_s: Optional[float],
        on_delta: Optional[Callable[[Dict[str, Any]], None]] = None,
    ):
        self._c = client
        self.run_id = run_id
        self.last_event_id = last_event_id
        self.until_settled = until_settled
        self.end: Optional[CloudEvent] = None
        self._deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._on_delta = on_delta
        self._deltas_seen: set = set()  # (iteration, seq): a reconnect sends the held ones again

    def _lines(self, resp) -> Iterator[bytes]:
        for line in iter(resp.readline, b""):
            if self._deadline is not None and time.monotonic() > self._deadline:
                raise ToolwireError(0, "", f"run {self.run_id}: not ended within the follow's timeout", final=True)
            yield line

    def __iter__(self) -> Iterator[CloudEvent]:
        # Each iteration is a connection of its own, from the last event received on.
        if self.end is not None and not self.until_settled:
            return
        failures = 0
        retry_s = self._c.retry_s
        while True:
            try:
                conn, resp = self._c._open_stream(self.run_id, self.last_event_id)
                try:
                    for m in parse_sse(self._lines(resp)):
                        if m.retry is not None:
                            retry_s = m.retry / 1000
                        if m.event == "end":
                            return
                        if m.event == "error":  # e.g. the run was never recorded
                            raise _error(0, m.data.encode(), final=True)
                        if m.event == "delta":
                            self._delta(m.data)
                            continue
                        if m.id is not None:
                            self.last_event_id = m.id
                        if m.data == "" or m.event != "message":
                            continue
                        failures = 0
                        e: CloudEvent = json.loads(m.data)
                        yield e
                        if e.get("type") in END_TYPES:
                            self.end = e
                            if not self.until_settled:
                                return
                finally:
                    conn.close()
                # Closed without an end: the connection dropped; reconnect.
                failures += 1
                last = ToolwireError(0, "", "the stream closed before the run's end")
            except ToolwireError as err:
                if err.final or (err.status != 0 and err.status < 500 and err.status not in (408, 429)):
                    raise
                failures += 1
                last = err
            except (OSError, http.client.HTTPException, ValueError) as err:
                failures += 1
                last = ToolwireError(0, "", str(err))
            if failures > self._c.max_retries:
                raise ToolwireError(
                    0, "", f"run {self.run_id}: the event stream failed {failures} times in a row: {last}"
                )
            time.sleep(retry_s)


    def _delta(self, data: str) -> None:
        """Hands a delta to on_delta, once: a piece of a streamed model answer
        (pkg/events/delta.go), never stored, so it does not move last_event_id."""
        if self._on_delta is None:
            return
        try:
            d = json.loads(data)
            key = (int(d["iteration"]), int(d["seq"]))
        except (ValueError, KeyError, TypeError):
            return  # not a delta: the server validates them; skip what is not one
        if key in self._deltas_seen:
            return
        self._deltas_seen.add(key)
        self._on_delta(d)


class Client:
    """toolwire's HTTP API.

    base_url is the recorder's address (http://127.0.0.1:8088, no /v1);
    token an API token (`toolwire tokens create`) or an OIDC ID token, None
    when authentication is off. timeout bounds each request, and each read
    of the stream (the server sends a keep-alive every 15 s).
    """

    def __init__(
        self,
        base_url: str,
        token: Optional[str] = None,
        timeout: float = 30.0,
        retry_s: float = 1.0,
        max_retries: int = 10,
    ):
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.retry_s = retry_s
        self.max_retries = max_retries

    # -- writes ---------------------------------------------------------------

    def submit(self, request: RunRequest) -> Submitted:
        """Submits a run. The same request again answers the same run (created False);
        another request under a used run id raises ToolwireError (409, run_id_in_use)."""
        # A 503 means the handover was not confirmed in time; the run id makes
        # sending the same request again safe, and its answer is the outcome.
        for attempt in (1, 2, 3):
            try:
                return Submitted(**_pick(self._json("POST", "/v1/runs", request), Submitted))
            except ToolwireError as err:
                if err.status != 503 or attempt == 3:
                    raise
                time.sleep(self.retry_s)
        raise AssertionError("unreachable")

    def cancel(self, run_id: str, reason: Optional[str] = None) -> CancelResult:
        """Asks for the run's end; a run that has ended already answers cancelled False."""
        body = {} if reason is None else {"reason": reason}
        return CancelResult(**_pick(self._json("POST", f"/v1/runs/{_seg(run_id)}/cancel", body), CancelResult))

    def decide(self, run_id: str, call_id: str, decision: Decision, note: Optional[str] = None) -> DecisionResult:
        """Decides on a call waiting for an approval: approve (it runs), deny or revise (POLICY_DENIED)."""
        body: Dict[str, Any] = {"decision": decision}
        if note is not None:
            body["note"] = note
        path = f"/v1/runs/{_seg(run_id)}/calls/{_seg(call_id)}/decision"
        return DecisionResult(**_pick(self._json("POST", path, body), DecisionResult))

    # -- reads ----------------------------------------------------------------

    def get(self, run_id: str) -> Dict[str, Any]:
        """The run as recorded, with the summary of its tool calls (RunDetail)."""
        return self._json("GET", f"/v1/runs/{_seg(run_id)}")

    def outputs(self, run_id: str, wait_s: Optional[float] = None) -> AgentOutputs:
        """The outputs of a completed run; a failed run or one not ended raises ToolwireError (409).

        With wait_s (at most 60), a run not ended yet is waited for: the answer comes as soon as it ends."""
        path = f"/v1/runs/{_seg(run_id)}/outputs"
        if wait_s:
            if not 0 < wait_s <= 60:
                raise ValueError("wait_s must be above 0 and at most 60")
            path += "?" + urllib.parse.urlencode({"wait": f"{int(wait_s * 1000)}ms"})
        return self._json("GET", path, timeout=max(self.timeout, (wait_s or 0) + 5))  # type: ignore[return-value]

    def follow(
        self,
        run_id: str,
        last_event_id: Optional[str] = None,
        until_settled: bool = False,
        timeout_s: Optional[float] = None,
        on_delta: Optional[Callable[[Dict[str, Any]], None]] = None,
    ) -> Follower:
        """The run's events, live, up to its end event (until_settled: until the server
        closes the stream, once every event of the run is recorded). The stream may be
        opened before the run exists; a dropped connection is reopened with Last-Event-ID.
        timeout_s bounds the whole follow (checked at each line, keep-alives included).

        on_delta, for an agent that streams (agent.stream), is called with each piece
        of the model's answer as it arrives (a dict: run_id, iteration, attempt, seq and
        one of text, tool_call, discarded), in order among the events and once each; a
        discarded delta voids what its attempt streamed."""
        return Follower(self, run_id, last_event_id, until_settled, timeout_s, on_delta)

    def wait(self, run_id: str) -> CloudEvent:
        """Follows the run to its end and returns its end event."""
        f = self.follow(run_id)
        for _ in f:
            pass
        if f.end is None:
            raise ToolwireError(0, "", f"run {run_id}: the event stream ended before the run did")
        return f.end

    # -- plumbing -------------------------------------------------------------

    def _headers(self) -> Dict[str, str]:
        h = {"Accept": "application/json"}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        return h

    def _json(self, method: str, path: str, body: Any = None, timeout: Optional[float] = None) -> Any:
        data = None
        headers = self._headers()
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            raise _error(err.code, err.read()) from None
        except (urllib.error.URLError, OSError) as err:
            raise ToolwireError(0, "", f"{method} {path}: {err}") from None

    def _open_stream(self, run_id: str, last_event_id: Optional[str]):
        u = urllib.parse.urlsplit(self.base_url)
        cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
        conn = cls(u.netloc, timeout=self.timeout)
        headers = self._headers()
        headers["Accept"] = "text/event-stream"
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        try:
            conn.request("GET", f"{u.path}/v1/runs/{_seg(run_id)}/events/stream", headers=headers)
            resp = conn.getresponse()
        except BaseException:
            conn.close()
            raise
        if resp.status != 200:
            body = resp.read()
            conn.close()
            raise _error(resp.status, body)
        return conn, resp


def _seg(s: str) -> str:
    return urllib.parse.quote(s, safe="")


def _pick(d: Dict[str, Any], cls: type) -> Dict[str, Any]:
    """The fields of the dataclass cls from an answer that may carry more."""
    return {k: d.get(k) for k in cls.__dataclass_fields__}  # type: ignore[attr-defined]


def _error(status: int, body: bytes, final: bool = False) -> ToolwireError:
    try:
        e = json.loads(body)["error"]
        return ToolwireError(status, e.get("code", ""), e.get("message", ""), e.get("details"), final)
    except (ValueError, KeyError, TypeError):
        return ToolwireError(status, "", f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}")
