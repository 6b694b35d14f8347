// The embedded log's record frames (core/log/embedded/record-format.ts): u32 bodyLength | u32 crc32(body) |
// body, big-endian. Checking a read chunk's frames here takes one call per chunk instead of a CRC call per
// record from JS, where the call cost several times the CRC itself. Pure compute, no N-API here.
#pragma once
#include <cstddef>
#include <cstdint>

namespace rls {

// CRC-32 with zlib's polynomial and conventions (crc32(crc, buf, len)): continue from `crc` (0 to start).
uint32_t crc32_of(const uint8_t* buf, size_t len, uint32_t crc);

// Walks whole, CRC-valid frames of buf[from, limit): stops at the first frame that is truncated, implausible
// (body shorter than min_body or longer than max_body) or fails its CRC, or after max_records. Returns the
// position after the last good frame; *records counts them.
size_t check_frames(const uint8_t* buf, size_t from, size_t limit, size_t max_records, uint32_t min_body,
                    uint32_t max_body, size_t* records);

// Writes the body CRC of every frame of buf[from, limit) (their lengths written), and returns the CRC-32 of
// the whole range afterwards. The frames must tile the range exactly (the caller checked).
uint32_t seal_frames(uint8_t* buf, size_t from, size_t limit);

}  // namespace rls
