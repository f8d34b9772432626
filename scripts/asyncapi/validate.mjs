// Validates AsyncAPI documents with @asyncapi/parser: the specification's
// JSON Schema and its rules (spectral), every $ref resolved from disk,
// relative to the document. Prints every diagnostic; exits 1 when one is an
// error. Usage: node validate.mjs docs/asyncapi.yaml ...
import { Parser, fromFile } from '@asyncapi/parser';

const severities = ['error', 'warning', 'info', 'hint'];
const parser = new Parser();
let failed = false;
for (const file of process.argv.slice(2)) {
  const { document, diagnostics } = await fromFile(parser, file).parse();
  for (const d of diagnostics) {
    const where = d.path && d.path.length ? ' at ' + d.path.join('.') : '';
    console.log(`${file}: ${severities[d.severity] ?? d.severity}: ${d.code}: ${d.message}${where}`);
  }
  const errors = diagnostics.filter((d) => d.severity === 0).length;
  if (errors > 0 || !document) {
    failed = true;
    console.log(`${file}: ${errors} error(s)`);
    continue;
  }
  console.log(`${file}: valid AsyncAPI ${document.version()}: ${document.channels().length} channels, ` +
    `${document.operations().length} operations, ${document.allMessages().length} messages, ` +
    `${diagnostics.length} diagnostics`);
}
process.exit(failed ? 1 : 0);
