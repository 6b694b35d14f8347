// verl's interaction YAML (`interaction: [{name, class_name, config}]`) as `interaction.config` reads it: verl's own
// gsm8k_interaction_config.yaml (examples/gsm8k-tool/) gives the gsm8k interaction scoring as verl's current one
// does; names default as verl derives them; a class rlstream cannot run, a name given twice, a key verl does not
// have, each fail naming the entry; a module class is constructed with the entry's config and name; and a run
// config naming the file resolves to the file's interactions in place of the built-ins.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { loadRunConfig } from '../../cli/config/run-config.ts';
import { defaultInteractionName, interactionsFromYaml, loadInteractionConfig } from '../../producers/agent/interaction-config.ts';
import { resolvePlugins } from '../../cli/run/plugins.ts';

const VERL_FILE = join(import.meta.dirname, '../../examples/gsm8k-tool/gsm8k_interaction_config.yaml');
const ask = (content: string) => [{ role: 'user', content: 'q' }, { role: 'assistant', content }];

test("verl's gsm8k_interaction_config.yaml loads as it is and scores as verl's Gsm8kInteraction", async () => {
  const map = await loadInteractionConfig(VERL_FILE);
  assert.deepEqual([...map.keys()], ['gsm8k']);
  const gsm8k = map.get('gsm8k')!;
  assert.equal(gsm8k.name, 'gsm8k');
  const right = await gsm8k.respond('i', ask('3 + 15 makes 18'), { ground_truth: '18' });
  assert.deepEqual(right, { terminate: true, content: 'Your response is correct!', reward: 1 });
  const wrong = await gsm8k.respond('i', ask('#### 17'), { ground_truth: '18' });
  assert.deepEqual(wrong, { terminate: false, content: 'Your response is incorrect! You need to reflect on your answer and try again.', reward: 0 });
});

test('names default as verl derives them; bad entries fail naming the entry', async () => {
  assert.equal(defaultInteractionName('verl.interactions.gsm8k_interaction.Gsm8kInteraction'), 'gsm8k');
  assert.equal(defaultInteractionName('my.pkg.Tutor'), 'tutor');
  const unnamed = await interactionsFromYaml('interaction:\n  - class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction\n', '.');
  assert.deepEqual([...unnamed.keys()], ['gsm8k']);
  const two = await interactionsFromYaml('interaction:\n  - {name: a, class_name: gsm8k}\n  - {name: b, class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction}\n', '.');
  assert.deepEqual([...two.keys()], ['a', 'b']);
  assert.equal(two.get('a')!.name, 'a');
  const cases: [string, RegExp][] = [
    ['interaction:\n  - {class_name: verl.interactions.weather_interaction.WeatherInteraction}\n', /interaction\[0\]\.class_name: no rlstream interaction for "verl\.interactions\.weather_interaction\.WeatherInteraction" \(verl classes that map: verl\.interactions\.gsm8k_interaction\.Gsm8kInteraction/],
    ['interaction:\n  - {name: x, class_name: gsm8k}\n  - {name: x, class_name: gsm8k}\n', /interaction\[1\]\.name: "x" is named twice/],
    ['interaction:\n  - {name: x, class_name: gsm8k, kwargs: {}}\n', /interaction\[0\]\.kwargs: not a key/],
    ['interaction:\n  - {name: x}\n', /interaction\[0\]\.class_name must be a non-empty string/],
    ['interaction: {name: x}\n', /must have an `interaction:` list/],
    ['tools: []\n', /must have an `interaction:` list/],
    ['interaction: [\n', /not valid YAML/],
  ];
  for (const [text, re] of cases) await assert.rejects(interactionsFromYaml(text, '.'), (err: Error) => re.test(err.message), text);
});

test('a module class is constructed with the entry config and its name; a run config resolves to the file', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rlstream-interaction-'));
  try {
    writeFileSync(
      join(dir, 'tutor.ts'),
      'export class Tutor { name: string; config: Record<string, unknown>; constructor(c: Record<string, unknown>) { this.name = String(c.name); this.config = c; } respond() { return { terminate: true, content: String(this.config.reply), reward: 0.5 }; } }\n',
    );
    writeFileSync(join(dir, 'interactions.yaml'), 'interaction:\n  - class_name: ./tutor.ts:Tutor\n    config: {reply: well done}\n  - name: gsm8k\n    class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction\n    config: {}\n');
    const map = await loadInteractionConfig(join(dir, 'interactions.yaml'));
    assert.deepEqual([...map.keys()], ['tutor', 'gsm8k']);
    assert.deepEqual(await map.get('tutor')!.respond('i', [], {}), { terminate: true, content: 'well done', reward: 0.5 });

    const config = loadRunConfig(join(import.meta.dirname, '../../examples/gsm8k-tool/config.yaml'), { 'interaction.config': join(dir, 'interactions.yaml'), 'run.data_dir': dir });
    assert.equal(config.interaction.config, join(dir, 'interactions.yaml'));
    const plugins = await resolvePlugins(config);
    assert.deepEqual(plugins.interactions.names().sort(), ['gsm8k', 'tutor']);
    assert.equal((await plugins.interactions.get('tutor').respond('i', [], {})).content, 'well done');
    // Without the key: the built-in gsm8k, as before.
    const plain = await resolvePlugins(loadRunConfig(join(import.meta.dirname, '../../examples/gsm8k-tool/config.yaml'), { 'run.data_dir': dir }));
    assert.deepEqual(plain.interactions.names(), ['gsm8k']);
    // A file that is not there fails at config load, naming the key.
    await assert.rejects(resolvePlugins(loadRunConfig(join(import.meta.dirname, '../../examples/gsm8k-tool/config.yaml'), { 'interaction.config': join(dir, 'missing.yaml'), 'run.data_dir': dir })), /interaction\.config: .*missing\.yaml cannot be read/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
