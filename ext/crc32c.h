/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) as used by Kafka's
 * RecordBatch v2 header (crc field at byte 17 covers bytes [21, end)).
 *
 * Convention: crc starts at 0 and the return value is the finished CRC, so
 * crc32c_update(crc32c_update(0, a, n), b, m) == CRC of a||b, and
 * crc32c_update(0, "123456789", 9) == 0xE3069283.
 *
 * The implementation (hardware SSE4.2 or slicing-by-8 tables) is chosen once
 * when the shared object is loaded. Setting KBROKER_CRC32C_SOFTWARE=1 in the
 * environment before import forces the table path. All functions are
 * thread-safe and never touch the Python runtime (callable without the GIL). */
#ifndef KBROKER_CRC32C_H
#define KBROKER_CRC32C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

uint32_t crc32c_update(uint32_t crc, const void *buf, size_t len);

/* 1 when crc32c_update runs on the CPU's crc32 instruction, else 0. */
int crc32c_hw_available(void);

/* The table path, always available; tests compare it with the hardware path. */
uint32_t crc32c_update_sw(uint32_t crc, const void *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif
