// README.md's "Flags" block of the Serving section is `dsv4 serve --help`
// verbatim: a flag added, renamed or re-described without the README fails here.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { env, here } from './harness.mjs';

test('README documents `dsv4 serve --help` exactly', () => {
  const help = execFileSync(env('DSV4_BIN'), ['serve', '--help'], { encoding: 'utf8' });
  const readme = fs.readFileSync(path.join(here, '..', '..', 'README.md'), 'utf8');
  const start = readme.indexOf('$ dsv4 serve --help\n');
  assert.ok(start >= 0, 'README.md has no "$ dsv4 serve --help" block');
  const body = readme.slice(start + '$ dsv4 serve --help\n'.length);
  const block = body.slice(0, body.indexOf('```'));
  assert.equal(block.trimEnd(), help.trimEnd());
  for (const flag of ['--sessions', '--kv-disk-dir', '--kv-disk-space-mb', '--kv-cache-min-tokens', '--kv-cache-frontier'])
    assert.ok(help.includes(flag), flag);
});
