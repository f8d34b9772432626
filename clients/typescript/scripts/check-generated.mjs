// Fails when src/schema.ts is not what openapi-typescript generates from
// services/recorder/api/openapi.yaml now: run `npm run generate` and commit it.
// Usage: node scripts/check-generated.mjs [--write]
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const pkg = join(dirname(fileURLToPath(import.meta.url)), "..");
const spec = join(pkg, "..", "..", "services", "recorder", "api", "openapi.yaml");
const committed = join(pkg, "src", "schema.ts");
const dir = mkdtempSync(join(tmpdir(), "toolwire-schema-"));
try {
  const out = join(dir, "schema.ts");
  const bin = join(pkg, "node_modules", "openapi-typescript", "bin", "cli.js");
  execFileSync(process.execPath, [bin, spec, "--output", out], { stdio: ["ignore", "ignore", "inherit"] });
  const want = readFileSync(out, "utf8");
  if (process.argv.includes("--write")) {
    writeFileSync(committed, want);
    console.log("check-generated: wrote src/schema.ts");
  } else if (readFileSync(committed, "utf8") !== want) {
    console.error("check-generated: src/schema.ts is not generated from the current services/recorder/api/openapi.yaml: " +
      "run `npm run generate` in clients/typescript and commit it");
    process.exit(1);
  } else {
    console.log("check-generated: src/schema.ts is current with services/recorder/api/openapi.yaml");
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
