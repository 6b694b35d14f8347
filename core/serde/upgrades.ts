// Meaning that Avro's schema resolution alone does not carry from an older schema version to the current one.
// The serde decides once per writer schema which upgrades apply (by what that schema lacks) and runs them on
// each record it resolved from that schema; a record written under the current schema is read as written, so
// a convention retired from the contract never comes back for new records.
import avro from 'avsc';

export interface ReadUpgrade {
  /** What it upgrades, for errors and docs. */
  readonly description: string;
  /** Whether records written with `writer` need it (decided once per writer schema id). */
  applies(writer: avro.Type): boolean;
  /** Rewrites a record already resolved to the current schema, in place. */
  apply(value: Record<string, unknown>): void;
}

/**
 * The reward component DAPO's overlong filtering (reward.shaping.mask_truncated) added, value 0, to mark a
 * trajectory cut at the token limit as kept out of the loss, before RewardInfo.exclude_from_loss (history v2 of
 * RewardedTrajectory and AdvantagedTrajectory) carried that as a field.
 */
export const LEGACY_TRUNCATED_MASKED = 'shaping.truncated_masked';

/** The type of a record's field, or undefined when `type` is no record or has no such field. */
function recordField(type: avro.Type | undefined, name: string): avro.Type | undefined {
  return type instanceof avro.types.RecordType ? (type.field(name) as avro.types.Field | undefined)?.type : undefined;
}

/** A RewardInfo written before exclude_from_loss: its legacy marker component becomes the field. */
const truncatedMaskedMarker: ReadUpgrade = {
  description: `RewardInfo.exclude_from_loss from the ${LEGACY_TRUNCATED_MASKED} component of records written before the field`,
  applies(writer) {
    const reward = recordField(writer, 'reward');
    return reward instanceof avro.types.RecordType && recordField(reward, 'exclude_from_loss') === undefined;
  },
  apply(value) {
    const reward = value['reward'] as { components: { name: string }[]; exclude_from_loss: boolean };
    if (reward.components.some((c) => c.name === LEGACY_TRUNCATED_MASKED)) reward.exclude_from_loss = true;
  },
};

/** Every upgrade, oldest convention first. */
export const READ_UPGRADES: readonly ReadUpgrade[] = [truncatedMaskedMarker];

/** The upgrades records written with `writer` need. */
export function upgradesFor(writer: avro.Type): ReadUpgrade[] {
  return READ_UPGRADES.filter((u) => u.applies(writer));
}
