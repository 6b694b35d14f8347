// Where a replay writes: the trace store (rebuild), a topic (re-derived rewards / advantages, or a plain copy),
// a chat-format SFT dataset (jsonl), or another log (copy with schemas re-registered and records re-framed).
// Every derived event gets a derived id and the source record's timestamp as its time, so replaying the same
// range twice produces the same events and idempotent consumers drop the second copy.
import { createWriteStream } from 'node:fs';
import { link, rename, rm } from 'node:fs/promises';
import { once } from 'node:events';
import { deriveId } from '../../core/ids.ts';
import { describeError, RlstreamError } from '../../core/errors.ts';
import type { EventLog, LogRecord, ProduceRecord, Producer, RecordChunk } from '../../core/log/types.ts';
import { EventSerde, subjectOf, type DecodedEvent, type Encodable } from '../../core/serde/events.ts';
import type { SchemaRegistry } from '../../core/serde/registry.ts';
import type { TraceStore } from '../../core/traces/store.ts';
import { EVENT_NAMES, isEventName } from '../../schemas/index.ts';
import type { AdvantagedTrajectory, Message, RewardInfo, RewardedTrajectory, ToolCall, ToolCallCompleted, ToolSpec, TurnCompleted } from '../../schemas/generated/types.ts';
import { advantagedBody, advantageGroup, checkMember, getsAdvantage, rewardedSample, type AdvantageStage } from '../advantage/stage.ts';
import { rewardTrajectory, type RewardStage } from '../reward/stage.ts';
import { TraceIngest } from '../traces/ingest.ts';
import { TraceWriter } from '../traces/writer.ts';

export interface ReplayTarget {
  readonly describe: string;
  /** One batch of source records, with their decoded events (null where undecodable, or not decoded). */
  accept(batch: { record: LogRecord; event: DecodedEvent | null }[]): Promise<void>;
  /** Whether accept() needs the decoded events (default true): targets that read the bytes themselves do not. */
  readonly needsEvents?: boolean;
  /** Records this target found undecodable itself (when it takes them undecoded). */
  readonly undecodable?: number;
  /**
   * The same records as chunks of the embedded log's frames, read in place (see RecordChunk); the job hands
   * chunks instead of batches to a target that has this and needs no events.
   */
  acceptChunks?(chunks: RecordChunk[]): Promise<void>;
  /** Everything accepted is written. */
  finish(): Promise<void>;
  /** The replay failed or was cancelled: release what is held without completing the output (default: finish()). */
  abort?(): Promise<void>;
  readonly written: number;
}

/**
 * Rebuild traces: the sink's own ingest (native transcoders, the general path for the rest) and batched writer.
 * It reads the records' bytes itself, so the job need not decode them first.
 */
export class TracesTarget implements ReplayTarget {
  readonly describe: string;
  readonly needsEvents = false;
  private readonly writer: TraceWriter;
  private readonly ingest: TraceIngest;
  written = 0;

  constructor(store: TraceStore, serde: EventSerde) {
    this.describe = `traces ${store.target}`;
    this.writer = new TraceWriter(store, { maxDelayMs: 5_000 });
    this.ingest = new TraceIngest(serde, this.writer);
  }

  get undecodable(): number {
    return this.ingest.stats.deadLetters;
  }

  /** Records written through a native transcoder. */
  get transcoded(): number {
    return this.ingest.stats.transcoded;
  }

  async accept(batch: { record: LogRecord }[]): Promise<void> {
    await this.ingest.add(batch.map((b) => b.record));
    await this.flushWhenDue();
  }

  async acceptChunks(chunks: RecordChunk[]): Promise<void> {
    await this.ingest.addChunks(chunks);
    await this.flushWhenDue();
  }

  /** One write in flight while the next batches are read, as the sink does. */
  private async flushWhenDue(): Promise<void> {
    if (this.writer.dueBehind()) await this.writer.flushBehind((n) => void (this.written += n));
  }

  async finish(): Promise<void> {
    await this.writer.settle();
    this.written += await this.writer.flush();
  }
}

export interface DeriveOptions {
  /** Recompute the reward of every TrajectoryCompleted with this reward stage (the run's, see cli/commands/replay.ts). */
  reward?: RewardStage;
  /** Recompute advantages per group with this advantage stage. */
  advantage?: AdvantageStage;
  /** A group still incomplete at the end of the range: its members are dropped, or emitted as the run's consumer emits a timed-out group. Default drop. */
  partialGroups?: 'drop' | 'emit';
  /** Names this derivation in the derived events' ids, so another derivation of the same records gets other ids. */
  label: string;
}

/**
 * Into a topic. With a reward stage: RewardedTrajectory for every TrajectoryCompleted; with an advantage stage:
 * AdvantagedTrajectory for every group of rewarded trajectories (recomputed ones when a reward stage is given,
 * else the log's RewardedTrajectory events). With neither: the records are copied as they are. Rewards and
 * advantages are computed by the same stage functions as the run's consumers; a record those refuse (the run's
 * consumer dead-letters it) is counted in `refused`, with the first reason in `firstRefusal`.
 */
export class TopicTarget implements ReplayTarget {
  readonly describe: string;
  written = 0;
  private readonly groups = new Map<string, { members: RewardedTrajectory[]; time: number }>();
  private out: ProduceRecord[] = [];
  droppedPartialGroups = 0;
  /** Groups dynamic sampling filtered (all rewards equal), and trajectories of another split than train (no advantages). */
  filteredGroups = 0;
  skippedNotTrain = 0;
  refused = 0;
  firstRefusal: string | null = null;

  private constructor(
    private readonly producer: Producer,
    private readonly topic: string,
    private readonly serde: EventSerde,
    private readonly options: DeriveOptions,
  ) {
    this.describe = `topic ${topic}`;
  }

  static async open(log: EventLog, topic: string, serde: EventSerde, options: DeriveOptions, partitions = 1): Promise<TopicTarget> {
    await log.createTopic({ name: topic, partitions }).catch((err: unknown) => {
      // An existing topic with another partition count is fine for a replay target.
      if (!(err instanceof RlstreamError && err.code === 'LOG_TOPIC_EXISTS')) throw err;
    });
    return new TopicTarget(await log.producer({ idempotent: true }), topic, serde, options);
  }

  private refuse(err: unknown): void {
    this.refused++;
    this.firstRefusal ??= describeError(err);
  }

  async accept(batch: { record: LogRecord; event: DecodedEvent | null }[]): Promise<void> {
    const { reward, advantage } = this.options;
    for (const { record, event } of batch) {
      if (!reward && !advantage) {
        this.out.push({ key: record.key, value: record.value, timestamp: record.timestamp, headers: record.headers });
        continue;
      }
      if (!event) continue;
      if (reward && event.name === 'TrajectoryCompleted') {
        const t = event.value.trajectory;
        let info: RewardInfo;
        try {
          info = await rewardTrajectory(reward, t);
        } catch (err) {
          this.refuse(err);
          continue;
        }
        const rewarded: RewardedTrajectory = { event_id: deriveId(event.value.event_id, 'replay-reward', this.options.label), time_ms: record.timestamp, trajectory: t, reward: info };
        if (advantage) this.addToGroup(rewarded, record.timestamp);
        else this.emit('RewardedTrajectory', rewarded, t.group_id, record.timestamp);
      } else if (!reward && advantage && event.name === 'RewardedTrajectory') {
        this.addToGroup(event.value, record.timestamp);
      }
    }
    await this.send();
  }

  private addToGroup(r: RewardedTrajectory, time: number): void {
    if (!getsAdvantage(r.trajectory)) {
      this.skippedNotTrain++;
      return;
    }
    try {
      checkMember(r);
    } catch (err) {
      this.refuse(err);
      return;
    }
    const g = r.trajectory.group_id;
    const open = this.groups.get(g) ?? { members: [], time };
    // The same trajectory twice (a duplicate in the log) counts once.
    if (!open.members.some((m) => m.trajectory.trajectory_id === r.trajectory.trajectory_id)) open.members.push(r);
    this.groups.set(g, open);
    if (open.members.length >= Math.max(1, r.trajectory.group_size)) this.closeGroup(g, time);
  }

  private closeGroup(g: string, time: number): void {
    const { members } = this.groups.get(g)!;
    const stage = this.options.advantage!;
    this.groups.delete(g);
    let result;
    try {
      result = advantageGroup(stage, members, (m) => rewardedSample(stage, m), Math.max(1, members[0]!.trajectory.group_size));
    } catch (err) {
      for (let i = 0; i < members.length; i++) this.refuse(err);
      return;
    }
    if (result.filtered) {
      this.filteredGroups++;
      return;
    }
    for (const { member, result: r } of result.members) {
      this.emit('AdvantagedTrajectory', { event_id: deriveId(member.event_id, 'replay-advantage', this.options.label), time_ms: time, ...advantagedBody(stage, member, r, result.stats) }, g, time);
    }
  }

  private emit(name: 'RewardedTrajectory' | 'AdvantagedTrajectory', value: RewardedTrajectory | Encodable<AdvantagedTrajectory>, key: string, time: number): void {
    this.out.push({ key, value: name === 'RewardedTrajectory' ? this.serde.encode(name, value as RewardedTrajectory) : this.serde.encode(name, value as Encodable<AdvantagedTrajectory>), timestamp: time });
  }

  private async send(): Promise<void> {
    if (this.out.length === 0) return;
    const batch = this.out;
    this.out = [];
    await this.producer.send(this.topic, batch);
    this.written += batch.length;
  }

  async finish(): Promise<void> {
    const partial = [...this.groups];
    if ((this.options.partialGroups ?? 'drop') === 'emit') for (const [g, { time }] of partial) this.closeGroup(g, time);
    else this.droppedPartialGroups = partial.length;
    this.groups.clear();
    await this.send();
    await this.producer.close();
  }
}

/** A chat message for SFT, in the shape chat templates read (Hugging Face / OpenAI). */
interface ChatMessage {
  role: string;
  content: string;
  tool_calls?: { id: string; type: 'function'; function: { name: string; arguments: string } }[];
  tool_call_id?: string;
  name?: string;
}

/** A tool offered to the model, in the shape chat templates read as `tools`. */
interface ChatTool {
  type: 'function';
  function: { name: string; description: string; parameters: unknown };
}

function chatOf(m: Message): ChatMessage {
  const out: ChatMessage = { role: m.role, content: m.content };
  if (m.tool_calls.length > 0) out.tool_calls = m.tool_calls.map((c) => ({ id: c.id, type: 'function', function: { name: c.name, arguments: c.arguments_json } }));
  if (m.tool_call_id) out.tool_call_id = m.tool_call_id;
  if (m.name) out.name = m.name;
  return out;
}

function toolOf(t: ToolSpec): ChatTool {
  let parameters: unknown = {};
  try {
    parameters = JSON.parse(t.parameters_json || '{}');
  } catch {
    // The worker wrote the schema with JSON.stringify; an unreadable one is offered as an empty schema.
  }
  return { type: 'function', function: { name: t.name, description: t.description, parameters } };
}

/** Why a successful trajectory is left out of the SFT data (counted by reason); other_split: not of the split asked for. */
export type SftSkipReason = 'other_split' | 'parse_error' | 'tokenization_mismatch' | 'user_turn' | 'missing_tool_result' | 'missing_turn';

/** Which problems the SFT export takes: the training ones (the default), the held-out ones, or all. */
export type SftSplit = 'train' | 'heldout' | 'all';

export interface JsonlOptions {
  /** Default train: held-out problems in SFT data would contaminate every later evaluation. */
  split?: SftSplit;
  /** Replace the file if it exists (else the export fails at the end rather than replace it). */
  force?: boolean;
}

/**
 * Successful trajectories as a chat-format SFT dataset: one `{messages, tools}` line per trajectory whose
 * reward says correct (or, without `correct`, scored above 0), of the split asked for (train unless told), built
 * from its TrajectoryStarted prompt, its turns and its tool calls' results. The messages are the conversation
 * exactly as the agent held it, so the chat template renders them back to the trajectory's own token ids: an
 * assistant message keeps the text the model wrote (its tool-call blocks included; no separate `tool_calls`,
 * which the template would render a second time), and a tool message holds the tool's result (not the
 * template's markup around it, which is all a tool turn's decoded text is). Trajectories left out are counted
 * in `skipped` by reason: another split (`skippedSplits` by name), or a conversation the events cannot give back
 * exactly: a malformed tool call (SFT on it would teach it, and its error message is not an event), a user turn
 * from an interaction (its text is only in the tokens), a delta tokenization that disagreed with the template.
 * Lines are written at the end in (run, trajectory) order, so the file is the same whatever the read order; they
 * go to a temporary file that replaces the target only when complete.
 */
export class JsonlTarget implements ReplayTarget {
  readonly describe: string;
  written = 0;
  readonly skipped: Record<SftSkipReason, number> = { other_split: 0, parse_error: 0, tokenization_mismatch: 0, user_turn: 0, missing_tool_result: 0, missing_turn: 0 };
  /** Successful trajectories left out as another split, by split name. */
  readonly skippedSplits: Record<string, number> = {};
  readonly split: SftSplit;
  private readonly started = new Map<string, { messages: Message[]; tools: ToolSpec[] }>();
  private readonly turns = new Map<string, TurnCompleted[]>();
  private readonly toolResults = new Map<string, Map<string, ToolCallCompleted>>();
  private readonly success = new Map<string, { ok: boolean; turns: number; split: string }>();

  constructor(
    private readonly file: string,
    private readonly options: JsonlOptions = {},
  ) {
    this.split = options.split ?? 'train';
    this.describe = `jsonl ${file}`;
  }

  async accept(batch: { event: DecodedEvent | null }[]): Promise<void> {
    for (const { event } of batch) {
      if (!event) continue;
      if (event.name === 'TrajectoryStarted') this.started.set(`${event.value.run_id}/${event.value.trajectory_id}`, { messages: event.value.prompt_messages, tools: event.value.tools });
      else if (event.name === 'TurnCompleted') {
        const k = `${event.value.run_id}/${event.value.trajectory_id}`;
        // One turn per index, the latest: a log written before a restarted worker gave the trajectories it ran again
        // new ids holds a trajectory cut short by a crash and its rerun under one id, and the rerun (read later) is
        // the one its TrajectoryCompleted assembles.
        const list = (this.turns.get(k) ?? []).filter((t) => t.turn_index !== event.value.turn_index);
        list.push(event.value);
        this.turns.set(k, list);
      } else if (event.name === 'ToolCallCompleted') {
        const k = `${event.value.run_id}/${event.value.trajectory_id}`;
        const calls = this.toolResults.get(k) ?? new Map<string, ToolCallCompleted>();
        calls.set(event.value.call_id, event.value);
        this.toolResults.set(k, calls);
      } else if (event.name === 'RewardedTrajectory') {
        const r = event.value.reward;
        const t = event.value.trajectory;
        this.success.set(`${t.run_id}/${t.trajectory_id}`, { ok: r.correct ?? r.score > 0, turns: t.num_turns, split: t.dataset.split });
      }
    }
  }

  /** The conversation of one trajectory, or why it cannot be given back exactly. */
  private conversation(k: string): { messages: ChatMessage[]; tools: ChatTool[] } | SftSkipReason {
    const start = this.started.get(k)!;
    const turns = this.turns.get(k)!.sort((a, b) => a.turn_index - b.turn_index);
    if (turns.length !== this.success.get(k)!.turns) return 'missing_turn';
    const results = this.toolResults.get(k) ?? new Map<string, ToolCallCompleted>();
    const messages: ChatMessage[] = start.messages.map(chatOf);
    let lastCalls: ToolCall[] = [];
    for (const t of turns) {
      if (t.tokenization_mismatch) return 'tokenization_mismatch';
      if (t.role === 'assistant') {
        if (t.tool_call_parse_error !== null) return 'parse_error';
        messages.push({ role: 'assistant', content: t.text });
        lastCalls = t.tool_calls;
      } else if (t.role === 'tool') {
        for (const c of lastCalls) {
          const r = results.get(c.id);
          if (!r) return 'missing_tool_result';
          messages.push({ role: 'tool', content: r.result_text, tool_call_id: c.id, name: c.name });
        }
        lastCalls = [];
      } else return 'user_turn';
    }
    return { messages, tools: start.tools.map(toolOf) };
  }

  /** Nothing is written before finish(): a failed or cancelled replay leaves no file. */
  async abort(): Promise<void> {}

  async finish(): Promise<void> {
    const tmp = `${this.file}.${process.pid}.tmp`;
    const out = createWriteStream(tmp);
    try {
      const keys = [...this.success].filter(([k, s]) => s.ok && this.started.has(k) && this.turns.has(k)).map(([k]) => k).sort();
      for (const k of keys) {
        const split = this.success.get(k)!.split;
        if (this.split !== 'all' && split !== this.split) {
          this.skipped.other_split++;
          this.skippedSplits[split] = (this.skippedSplits[split] ?? 0) + 1;
          continue;
        }
        const chat = this.conversation(k);
        if (typeof chat === 'string') {
          this.skipped[chat]++;
          continue;
        }
        const line = chat.tools.length > 0 ? { messages: chat.messages, tools: chat.tools } : { messages: chat.messages };
        if (!out.write(JSON.stringify(line) + '\n')) await once(out, 'drain');
        this.written++;
      }
      out.end();
      await once(out, 'finish');
      // Without force, link() refuses a file that appeared meanwhile (EEXIST) where rename() would replace it.
      if (this.options.force) await rename(tmp, this.file);
      else await link(tmp, this.file);
    } catch (err) {
      out.destroy();
      if (isErrno(err, 'EEXIST')) throw new RlstreamError('INPUT_INVALID', `--into jsonl:${this.file} exists; --force replaces it`);
      throw err;
    } finally {
      await rm(tmp, { force: true });
    }
  }
}

function isErrno(err: unknown, code: string): boolean {
  return err instanceof Error && (err as NodeJS.ErrnoException).code === code;
}

/**
 * Into another log (embedded ↔ Kafka): same topics, partitions, keys, headers and timestamps; each value's
 * schema is registered in the target registry and the 4-byte id in its Confluent frame rewritten to the
 * target's id. Everything after the frame header is copied byte for byte.
 */
export class LogCopyTarget implements ReplayTarget {
  readonly describe: string;
  /** Records are copied as bytes (re-framed with the destination's schema ids), never decoded. */
  readonly needsEvents = false;
  written = 0;
  private readonly idMap = new Map<number, number>();
  private readonly created = new Set<string>();
  private producer: Producer | null = null;

  constructor(
    private readonly source: { log: EventLog; registry: SchemaRegistry },
    private readonly target: { log: EventLog; registry: SchemaRegistry; describe: string },
    /** Target topic name for a source topic (default: the same name). */
    private readonly rename: (topic: string) => string = (t) => t,
  ) {
    this.describe = `log ${target.describe}`;
  }

  private async targetId(sourceId: number): Promise<number> {
    let id = this.idMap.get(sourceId);
    if (id === undefined) {
      const text = await this.source.registry.getById(sourceId);
      const full = (JSON.parse(text) as { name?: string; namespace?: string }).name ?? 'unknown';
      const short = full.split('.').pop() ?? full;
      id = await this.target.registry.register(isEventName(short) ? subjectOf(short) : full, text);
      this.idMap.set(sourceId, id);
    }
    return id;
  }

  async reframe(value: Buffer): Promise<Buffer> {
    if (value.length < 5 || value[0] !== 0) return value;
    const id = await this.targetId(value.readUInt32BE(1));
    const out = Buffer.from(value);
    out.writeUInt32BE(id, 1);
    return out;
  }

  /**
   * Register every event schema version of the source in the target, in source-id order: a fresh target
   * then hands out ids in the same order, so a copy there and back again restores the original bytes.
   */
  private async copySchemas(): Promise<void> {
    const ids = new Set<number>();
    for (const name of EVENT_NAMES) for (const id of await this.source.registry.versions(subjectOf(name))) ids.add(id);
    for (const id of [...ids].sort((a, b) => a - b)) await this.targetId(id);
  }

  async accept(batch: { record: LogRecord }[]): Promise<void> {
    if (!this.producer) {
      await this.copySchemas();
      this.producer = await this.target.log.producer({ idempotent: true });
    }
    const byTopic = new Map<string, ProduceRecord[]>();
    for (const { record } of batch) {
      if (!this.created.has(record.topic)) {
        const spec = (await this.source.log.listTopics()).find((t) => t.name === record.topic);
        // The source's retention, and no limit where it has none (null): records keep their timestamps, so a
        // Kafka topic at the broker's default (days) would delete an older run's records minutes after the copy.
        const retention = { maxAgeMs: spec?.retention?.maxAgeMs ?? null, maxBytes: spec?.retention?.maxBytes ?? null };
        await this.target.log.createTopic({ name: this.rename(record.topic), partitions: spec?.partitions ?? 1, retention });
        this.created.add(record.topic);
      }
      const name = this.rename(record.topic);
      const list = byTopic.get(name) ?? [];
      list.push({ key: record.key, value: await this.reframe(record.value), partition: record.partition, timestamp: record.timestamp, headers: record.headers });
      byTopic.set(name, list);
    }
    for (const [topic, records] of byTopic) await this.producer.send(topic, records);
    this.written += batch.length;
  }

  async finish(): Promise<void> {
    await this.producer?.close();
    this.producer = null;
  }
}
