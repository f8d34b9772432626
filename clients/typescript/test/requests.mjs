// Scripted run requests: the scripted model plays the turns given, with no
// latency, so every run of the tests is deterministic.
let n = 0;

export function runId(prefix = "ts") {
  return `${prefix}-${Date.now().toString(36)}-${(n++).toString(36)}`;
}

/** A run whose model calls echo once with text, then answers "done". */
export function echoRun(text, { approval = false } = {}) {
  const policy = { max_iterations: 5 };
  if (approval) Object.assign(policy, { require_approval: { tools: ["echo"] }, approval_timeout_s: 600 });
  return {
    run_id: runId(),
    agent: {
      name: "client-tests",
      model: {
        provider: "scripted",
        name: "script-1",
        options: { script: [{ tool_calls: [{ name: "echo", arguments: { text } }] }, { content: "done" }] },
      },
      enabled_tools: ["echo@1.0.0"],
      policy,
    },
    messages: [{ role: "user", content: `echo ${text}` }],
  };
}
