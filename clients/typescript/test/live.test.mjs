// The client against a live `toolwire dev` (test/dev.mjs): submit, follow,
// outputs, resubmit, bad input, decide and cancel, each on a scripted run.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Client, ToolwireError, endStatus } from "../dist/index.js";
import { startDev } from "./dev.mjs";
import { echoRun } from "./requests.mjs";

const APPROVAL_REQUIRED = "dev.toolwire.call.approval_required.v1";
const CALL_COMPLETED = "dev.toolwire.call.completed.v1";

/** Follows a run until an event of type, and returns it with the follower (to go on with). */
async function until(follower, type) {
  for await (const e of follower) {
    if (e.type === type) return e;
    if (endStatus(e)) assert.fail(`run ended ${endStatus(e)} before ${type}`);
  }
  assert.fail(`the stream ended before ${type}`);
}

describe("toolwire client against toolwire dev", { timeout: 240_000 }, () => {
  let dev;
  let c;
  before(async () => {
    dev = await startDev();
    c = new Client({ baseUrl: dev.url, token: dev.token, timeoutMs: 20_000, retryMs: 200 });
  });
  after(async () => {
    await dev?.stop();
  });

  test("submit, then wait for the outputs", async () => {
    const req = echoRun("waited");
    assert.equal((await c.submit(req)).created, true);
    const out = await c.outputs(req.run_id, undefined, "30s");
    assert.equal(out.response, "done");
    assert.equal(out.tool_order.length, 1);
    assert.deepEqual(out.tools_by_id[out.tool_order[0]].output, { text: "waited" });
    await assert.rejects(c.outputs(req.run_id, undefined, "2m"), (e) => e.status === 400 && e.code === "invalid_parameter");
  });

  test("submit, follow to completion, outputs", async () => {
    const req = echoRun("hello");
    const sub = await c.submit(req);
    assert.equal(sub.run_id, req.run_id);
    assert.equal(sub.created, true);
    const seen = [];
    const f = c.follow(req.run_id);
    for await (const e of f) seen.push(e);
    const last = seen.at(-1);
    assert.equal(last.type, "dev.toolwire.run.completed.v1", `events: ${seen.map((e) => e.type).join(" ")}`);
    assert.equal(f.end, last);
    assert.ok(f.lastEventId, "the stream gave ids to resume from");
    for (const e of seen) {
      assert.equal(e.specversion, "1.0");
      assert.ok(e.id && e.source && e.type, JSON.stringify(e));
      assert.equal(e.runid, req.run_id);
    }
    assert.equal(seen[0].type, "dev.toolwire.run.requested.v1");
    const call = seen.find((e) => e.type === CALL_COMPLETED);
    assert.ok(call?.callid, "the call's envelope came, with its call id");

    const out = await c.outputs(req.run_id);
    assert.equal(out.response, "done");
    assert.deepEqual(out.tool_order, [call.callid]);
    assert.deepEqual(out.tools_by_id[call.callid].output, { text: "hello" });
    const run = await c.get(req.run_id);
    assert.equal(run.status, "completed");
    assert.equal(run.tenant.org_id, "acme", "the token's tenant, as the request named none");

    // Resuming after the last id repeats nothing: only what was recorded after the end, if anything.
    const rest = [];
    for await (const e of c.follow(req.run_id, { lastEventId: f.lastEventId, untilSettled: true })) rest.push(e);
    assert.ok(rest.every((e) => !seen.some((s) => s.id === e.id)), `resumed: ${rest.map((e) => e.id)}`);
  });

  test("resubmitting the same request answers the same run; another under its id is refused", async () => {
    const req = echoRun("twice");
    const first = await c.submit(req);
    const second = await c.submit(req);
    assert.equal(first.created, true);
    assert.equal(second.created, false);
    assert.equal(second.run_id, first.run_id);
    const other = { ...req, messages: [{ role: "user", content: "something else" }] };
    await assert.rejects(c.submit(other), (err) => {
      assert.ok(err instanceof ToolwireError);
      assert.equal(err.status, 409);
      assert.equal(err.code, "run_id_in_use");
      return true;
    });
    assert.equal((await c.wait(req.run_id)).type, "dev.toolwire.run.completed.v1");
  });

  test("bad input is the API's error object", async () => {
    const refused = (status, code) => (err) => {
      assert.ok(err instanceof ToolwireError, String(err));
      assert.equal(err.status, status, err.message);
      assert.equal(err.code, code, err.message);
      return true;
    };
    await assert.rejects(c.submit({ ...echoRun("x"), run_id: "not a run id!" }), (err) => {
      refused(422, "invalid_request")(err);
      assert.match(JSON.stringify(err.details), /run_id/, "details point at the field");
      return true;
    });
    await assert.rejects(c.submit({ ...echoRun("x"), messages: [] }), refused(422, "invalid_request"));
    await assert.rejects(c.submit({ ...echoRun("x"), colour: "blue" }), refused(400, "unknown_field"));
    await assert.rejects(c.submit({ ...echoRun("x"), tenant: { org_id: "someone-else" } }), refused(403, "tenant_mismatch"));
    await assert.rejects(c.get("no-such-run"), refused(404, "run_not_found"));
    await assert.rejects(c.cancel("no-such-run"), refused(404, "run_not_found"));
    const anon = new Client({ baseUrl: dev.url });
    await assert.rejects(anon.submit(echoRun("x")), refused(401, "unauthorized"));
  });

  test("decide approve on an approval-gated call: it runs and the run completes", async () => {
    const req = echoRun("approved", { approval: true });
    await c.submit(req);
    const f = c.follow(req.run_id);
    const waiting = await until(f, APPROVAL_REQUIRED);
    assert.ok(waiting.callid);
    const d = await c.decide(req.run_id, waiting.callid, "approve", "fine by the tests");
    assert.deepEqual(d, { run_id: req.run_id, call_id: waiting.callid, decision: "approve" });
    const done = await until(f, CALL_COMPLETED);
    assert.equal(done.callid, waiting.callid);
    for await (const _ of f);
    assert.equal(f.end?.type, "dev.toolwire.run.completed.v1");
    const out = await c.outputs(req.run_id);
    assert.deepEqual(out.tools_by_id[waiting.callid].output, { text: "approved" });
    await assert.rejects(c.decide(req.run_id, waiting.callid, "deny"),
      (err) => err instanceof ToolwireError && err.status === 409 && err.code === "already_decided");
    await assert.rejects(c.decide(req.run_id, "abcdef", "approve"),
      (err) => err instanceof ToolwireError && err.status === 404 && err.code === "call_not_found");
  });

  test("cancel a run that waits for an approval: it ends cancelled", async () => {
    const req = echoRun("never", { approval: true });
    await c.submit(req);
    // Bounded: the run must end on its cancel, not at its approval's timeout (600 s).
    const f = c.follow(req.run_id, { signal: AbortSignal.timeout(60_000) });
    await until(f, APPROVAL_REQUIRED);
    const res = await c.cancel(req.run_id, "the tests cancel it");
    assert.deepEqual(res, { run_id: req.run_id, status: "cancelling", cancelled: true });
    for await (const _ of f);
    assert.equal(f.end?.type, "dev.toolwire.run.cancelled.v1");
    assert.equal(endStatus(f.end), "cancelled");
    const again = await c.cancel(req.run_id);
    assert.equal(again.cancelled, false);
    assert.equal(again.status, "cancelled");
    assert.equal((await c.get(req.run_id)).status, "cancelled");
  });
});
