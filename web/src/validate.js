// The rule editor's check: the rule language's JSON Schema (schemas/rule-v1.schema.json,
// bundled at build time), evaluated by an interpreter — no code generation, so it runs
// under the console's Content-Security-Policy (no 'unsafe-eval'). The server checks the
// rule again with the engine's own parser before it publishes.
import { Validator } from '@cfworker/json-schema';
import schema from '../../schemas/rule-v1.schema.json';

const validator = new Validator(schema, '2020-12', false);

/** {ok, value, errors[]} for the editor's text. */
export function validateRule(text) {
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    return { ok: false, errors: [`not JSON: ${e.message}`] };
  }
  const r = validator.validate(value);
  if (r.valid) return { ok: true, value, errors: [] };
  // The deepest errors say the most; the "anyOf/oneOf failed" wrappers add little.
  const seen = new Set();
  const errors = r.errors
    .filter((e) => !['properties', 'allOf', '$ref', 'if', 'then', 'items', 'oneOf', 'anyOf', 'false'].includes(e.keyword))
    .map((e) => `${e.instanceLocation.replace(/^#/, '') || '/'}: ${e.error}`)
    .filter((e) => !seen.has(e) && seen.add(e));
  return { ok: false, value, errors: errors.length ? errors : r.errors.map((e) => e.error) };
}
