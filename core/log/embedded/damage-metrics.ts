// Prometheus gauges of the embedded log's damage, read from the log at each scrape: the offsets its partitions
// list as lost, the damaged ranges found by this process, and the offsets readers stepped over. A log that is
// not embedded registers nothing.
import { Gauge, type Registry } from 'prom-client';
import type { EventLog } from '../types.ts';
import { EmbeddedLog } from './index.ts';

export function registerLogDamageMetrics(registry: Registry, log: EventLog): void {
  if (!(log instanceof EmbeddedLog) || registry.getSingleMetric('rlstream_log_damage_ranges')) return;
  const labelNames = ['topic', 'partition'] as const;
  new Gauge({
    name: 'rlstream_log_damage_ranges',
    help: "Offset ranges lost to damage that the embedded log's partitions list (damage.json)",
    labelNames,
    registers: [registry],
    collect() {
      this.reset();
      for (const g of log.damageReport().gaps) this.inc({ topic: g.topic, partition: String(g.partition) });
    },
  });
  new Gauge({
    name: 'rlstream_log_damage_found_bytes',
    help: 'Damaged bytes this process moved to quarantine files (on open or when a read found them)',
    labelNames,
    registers: [registry],
    collect() {
      this.reset();
      for (const g of log.damageReport().foundNow) this.inc({ topic: g.topic, partition: String(g.partition) }, g.bytes);
    },
  });
  new Gauge({
    name: 'rlstream_log_gap_offsets_skipped',
    help: "Offsets this process's readers stepped over because they were lost to damage",
    labelNames,
    registers: [registry],
    collect() {
      this.reset();
      for (const s of log.damageReport().skipped) this.set({ topic: s.topic, partition: String(s.partition) }, s.offsets);
    },
  });
}
