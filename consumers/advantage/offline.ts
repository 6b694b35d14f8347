// Offline advantages over JSON lines ({trajectory_id, group_id, reward, response_mask, token_rewards?,
// values?}), the code path of `rlstream advantage`: every line is one batch, as verl sees a batch.
import { RlstreamError } from '../../core/errors.ts';
import { DEFAULT_ESTIMATOR_OPTIONS, getEstimator, type EstimatorOptions, type EstimatorSample } from './estimators.ts';

function numberArray(v: unknown, allow01: boolean): number[] | null {
  if (!Array.isArray(v)) return null;
  for (const x of v) {
    if (typeof x !== 'number' || !Number.isFinite(x)) return null;
    if (allow01 && x !== 0 && x !== 1) return null;
  }
  return v as number[];
}

export function parseAdvantageLines(text: string): { rows: Record<string, unknown>[]; samples: EstimatorSample[] } {
  const rows: Record<string, unknown>[] = [];
  const samples: EstimatorSample[] = [];
  const errors: string[] = [];
  text.split('\n').forEach((line, i) => {
    if (line.trim() === '') return;
    const n = i + 1;
    let row: unknown;
    try {
      row = JSON.parse(line);
    } catch (err) {
      return void errors.push(`line ${n}: not JSON (${(err as Error).message})`);
    }
    if (row === null || typeof row !== 'object' || Array.isArray(row)) return void errors.push(`line ${n}: expected a JSON object`);
    const r = row as Record<string, unknown>;
    if (typeof r['trajectory_id'] !== 'string') return void errors.push(`line ${n}: "trajectory_id" must be a string`);
    if (typeof r['group_id'] !== 'string') return void errors.push(`line ${n}: "group_id" must be a string`);
    if (typeof r['reward'] !== 'number' || !Number.isFinite(r['reward'])) return void errors.push(`line ${n}: "reward" must be a finite number`);
    const mask = numberArray(r['response_mask'], true);
    if (!mask) return void errors.push(`line ${n}: "response_mask" must be an array of 0 and 1`);
    const tokenRewards = r['token_rewards'] === undefined || r['token_rewards'] === null ? null : numberArray(r['token_rewards'], false);
    if (tokenRewards === null && r['token_rewards'] != null) return void errors.push(`line ${n}: "token_rewards" must be an array of finite numbers`);
    if (tokenRewards && tokenRewards.length !== mask.length) return void errors.push(`line ${n}: "token_rewards" has ${tokenRewards.length} entries, "response_mask" ${mask.length}`);
    const values = r['values'] === undefined || r['values'] === null ? null : numberArray(r['values'], false);
    if (values === null && r['values'] != null) return void errors.push(`line ${n}: "values" must be an array of finite numbers`);
    if (values && values.length !== mask.length) return void errors.push(`line ${n}: "values" has ${values.length} entries, "response_mask" ${mask.length}`);
    rows.push(r);
    samples.push({ groupId: r['group_id'], score: r['reward'], mask, tokenRewards, values });
  });
  if (errors.length > 0) throw new RlstreamError('INPUT_INVALID', errors.slice(0, 20).join('\n') + (errors.length > 20 ? `\n(${errors.length - 20} more)` : ''));
  return { rows, samples };
}

export function advantageLines(text: string, estimator: string, options: Partial<EstimatorOptions> = {}): string[] {
  const fn = getEstimator(estimator);
  const { rows, samples } = parseAdvantageLines(text);
  if (samples.length === 0) return [];
  const results = fn(samples, { ...DEFAULT_ESTIMATOR_OPTIONS, ...options });
  return rows.map((r, i) => JSON.stringify({ ...r, advantages: Array.from(results[i]!.advantages) }));
}
