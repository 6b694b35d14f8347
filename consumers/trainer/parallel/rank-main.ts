// The process of one data-parallel rank other than 0, started by launcher.ts: it loads the trainer's model as rank
// 0 does (rank-model.ts), joins the collective, and trains the share of every step rank 0 sends it, writing its
// optimizer shard into the step's checkpoint before rank 0 commits. It never reads or writes the log: rank 0 is
// the only process that does, so there is one consumer, one transaction and one set of offsets per step.
import { describeError } from '../../../core/errors.ts';
import type { Model } from '../../../native/index.ts';
import { saveOptimizerShard } from '../../../native/optimizer-state.ts';
import type { Collective } from '../../../native/collectives/collective.ts';
import { IpcCollective, type CollectiveMessage } from '../../../native/collectives/ipc-collective.ts';
import { NcclCollective } from '../../../native/collectives/nccl-collective.ts';
import { lossOptionsOf } from '../options.ts';
import type { FromRank, ToRank } from './protocol.ts';
import { loadTrainerModel } from './rank-model.ts';
import { DataParallelRank, rankStepThenCommit } from './rank-step.ts';

function send(m: FromRank): void {
  // the channel is gone when rank 0 is: the disconnect handler ends this process
  if (process.connected) process.send!(m);
}

let collective: Collective | null = null;
let model: Model | null = null;
let rank: DataParallelRank | null = null;
let work: Promise<void> = Promise.resolve();

async function init(m: Extract<ToRank, { t: 'init' }>): Promise<void> {
  try {
    if (m.collective === 'nccl') {
      send({ t: 'joining' });
      // every rank sees its own GPU alone (the launcher sets CUDA_VISIBLE_DEVICES): it is device 0 here
      collective = NcclCollective.join(m.ncclId!, m.size, m.rank, 0);
    } else {
      collective = new IpcCollective(m.rank, m.size, (c: CollectiveMessage) => send(c));
    }
    const c = collective;
    const options = { ...m.options, lossOptions: lossOptionsOf(m.options) };
    model = await loadTrainerModel(m.spec, options, (loaded) => (rank = new DataParallelRank(loaded, c, options)));
    send({ t: 'ready' });
  } catch (err) {
    send({ t: 'start-failed', error: describeError(err) });
    collective?.abort(err);
  }
}

async function step(m: Extract<ToRank, { t: 'step' }>): Promise<void> {
  try {
    const r = rank!;
    await rankStepThenCommit(
      r.collective,
      async () => {
        if (m.train) await r.step(m.samples, m.committed);
        await saveOptimizerShard(r.model, m.checkpointDir, r.collective.rank, r.collective.size);
      },
      async () => {},
    );
    send({ t: 'step-done' });
  } catch (err) {
    send({ t: 'step-failed', error: describeError(err) });
  }
}

process.on('message', (m: ToRank) => {
  if (m.t === 'coll-done' || m.t === 'coll-failed') {
    (collective as IpcCollective | null)?.onReply(m);
  } else if (m.t === 'init') {
    work = work.then(() => init(m));
  } else if (m.t === 'step') {
    work = work.then(() => step(m));
  } else if (m.t === 'close') {
    work = work.then(async () => {
      await collective?.close().catch(() => {});
      model?.dispose();
      process.exit(0);
    });
  }
});
// Rank 0 is gone (it exited or was killed): nothing this rank computes can be committed.
process.on('disconnect', () => process.exit(1));
send({ t: 'hello' });
