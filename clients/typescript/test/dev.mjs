// startDev starts a live `toolwire dev` for the tests: a binary built from
// this checkout (or $TOOLWIRE_BIN), its NATS and HTTP on free loopback ports,
// a temporary data folder with the recorder on SQLite, authentication on,
// and an API token made with `toolwire tokens create`. stop() ends it.
import { execFile, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const run = promisify(execFile);
const repo = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const readyWithin = 90_000;

export async function startDev({ org = "acme", role = "approver" } = {}) {
  const dir = mkdtempSync(join(tmpdir(), "toolwire-client-test-"));
  let bin = process.env.TOOLWIRE_BIN;
  if (!bin) {
    bin = join(dir, "toolwire");
    await run("go", ["build", "-o", bin, "./cmd/toolwire"], { cwd: repo, env: { ...process.env, GOFLAGS: "-buildvcs=false" } });
  }
  const data = join(dir, "data");
  const db = `sqlite:${join(data, "recorder.db")}`;
  const env = { ...process.env, TOOLWIRE_AUTH: "on" };
  delete env.DATABASE_URL;
  const child = spawn(bin, ["dev", "--data-dir", data, "--http", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--database-url", db],
    { cwd: dir, env, stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGTERM");
      const t = setTimeout(() => child.kill("SIGKILL"), 20_000);
      await exited;
      clearTimeout(t);
    }
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    const url = await new Promise((resolveURL, reject) => {
      let url;
      const timer = setTimeout(() => reject(new Error(`toolwire dev was not ready within ${readyWithin / 1000}s:\n${stderr}`)), readyWithin);
      child.stderr.setEncoding("utf8");
      child.stderr.on("data", (s) => {
        stderr += s;
        url ??= /API at (http:\/\/\S+)\/v1\/runs/.exec(stderr)?.[1];
        if (url && stderr.includes("all services running")) {
          clearTimeout(timer);
          resolveURL(url);
        }
      });
      child.once("exit", (code, sig) => {
        clearTimeout(timer);
        reject(new Error(`toolwire dev exited (${code ?? sig}) before it was ready:\n${stderr}`));
      });
    });
    const { stdout } = await run(bin, ["tokens", "create", "--database-url", db, "--name", "client-tests", "--org", org, "--role", role],
      { cwd: dir, env });
    return { url, token: stdout.trim(), bin, dir, stop, logs: () => stderr };
  } catch (err) {
    await stop();
    throw err;
  }
}
