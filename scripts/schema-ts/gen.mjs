// Generates TypeScript declarations from JSON Schema files, offline.
//
//   node scripts/schema-ts/gen.mjs OUT_DIR SCHEMA_FILE...
//
// Writes OUT_DIR/<name>.ts for each <name>.schema.json. Each file is compiled
// with json-schema-to-typescript from its place on disk: a $ref is resolved
// against the file's folder, and the ref parser's http resolver is off (and
// fetch and http(s) requests throw), so a $ref that would need the network fails
// instead of downloading.
import { mkdirSync, writeFileSync } from "node:fs";
import http from "node:http";
import https from "node:https";
import path from "node:path";
import { compileFromFile } from "json-schema-to-typescript";

// No network, whatever a resolver tries: a schema must load from disk alone.
const offline = (what) => () => {
  throw new Error(`gen.mjs: ${what} is disabled: every $ref must resolve from disk`);
};
globalThis.fetch = offline("fetch");
for (const mod of [http, https]) {
  mod.request = offline("http(s).request");
  mod.get = offline("http(s).get");
}

const [outDir, ...files] = process.argv.slice(2);
if (!outDir || files.length === 0) {
  console.error("usage: node gen.mjs OUT_DIR SCHEMA_FILE...");
  process.exit(2);
}
mkdirSync(outDir, { recursive: true });

const written = new Map();
let failed = 0;
for (const file of files) {
  const name = path.basename(file).replace(/\.schema\.json$|\.json$/, "");
  const out = path.join(outDir, name + ".ts");
  if (written.has(out)) {
    console.error(`${file}: ${out} is already ${written.get(out)}'s`);
    failed++;
    continue;
  }
  try {
    const ts = await compileFromFile(file, {
      bannerComment: `// Generated from ${path.basename(file)} by json-schema-to-typescript: do not edit.`,
      $refOptions: { resolve: { http: false } },
    });
    writeFileSync(out, ts);
    written.set(out, file);
  } catch (err) {
    console.error(`${file}: ${err && err.stack ? err.stack : err}`);
    failed++;
  }
}
if (failed > 0) {
  console.error(`${failed} of ${files.length} schema files failed`);
  process.exit(1);
}
console.log(`${files.length} schema files: ${[...written.keys()].map((p) => path.basename(p)).join(" ")}`);
