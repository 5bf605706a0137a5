/* CRC-32C for kbroker: SSE4.2 hardware path with runtime dispatch, and a
 * portable slicing-by-8 table path.
 *
 * Hardware path: the crc32 instruction folds 8 bytes per step but has a
 * latency of ~3 cycles and a throughput of 1/cycle, so long inputs run three
 * independent streams over adjacent blocks and merge them afterwards. Merging
 * uses that a raw CRC register (no pre/post inversion) is linear over GF(2):
 *     raw(c, A || B) = shift_|B|(raw(c, A)) ^ raw(0, B)
 * where shift_L(x) = raw(x, L zero bytes). For the two fixed block lengths we
 * precompute shift_L as four 256-entry tables (one per byte of x).
 *
 * Table path: classic slicing-by-8 (8 bytes per iteration via 8 tables).
 * Tables are built in a load-time constructor, so no lazy init races. */
#include "crc32c.h"

#include <stdlib.h>
#include <string.h>

#define POLY 0x82F63B78u /* reflected Castagnoli polynomial */

static uint32_t sw_table[8][256];

static void build_sw_tables(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
        sw_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = sw_table[0][n];
        for (int k = 1; k < 8; k++) {
            c = (c >> 8) ^ sw_table[0][c & 0xff];
            sw_table[k][n] = c;
        }
    }
}

/* Raw register update (no inversion), table path. */
static uint32_t sw_raw(uint32_t c, const unsigned char *p, size_t len)
{
    while (len && ((uintptr_t)p & 7)) {
        c = (c >> 8) ^ sw_table[0][(c ^ *p++) & 0xff];
        len--;
    }
    while (len >= 8) {
        /* Assemble little-endian words byte by byte: correct on any host
         * byte order, and compilers turn it into a single load on x86. */
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 |
                           (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 |
                      (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        c = sw_table[7][lo & 0xff] ^ sw_table[6][(lo >> 8) & 0xff] ^
            sw_table[5][(lo >> 16) & 0xff] ^ sw_table[4][lo >> 24] ^
            sw_table[3][hi & 0xff] ^ sw_table[2][(hi >> 8) & 0xff] ^
            sw_table[1][(hi >> 16) & 0xff] ^ sw_table[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    while (len--)
        c = (c >> 8) ^ sw_table[0][(c ^ *p++) & 0xff];
    return c;
}

uint32_t crc32c_update_sw(uint32_t crc, const void *buf, size_t len)
{
    return ~sw_raw(~crc, (const unsigned char *)buf, len);
}

static uint32_t (*crc32c_impl)(uint32_t, const void *, size_t) = crc32c_update_sw;
static int hw_selected = 0;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>

#define LONG_BLOCK 8192
#define SHORT_BLOCK 256

/* shift tables: shift_L(x) = t[0][x&255] ^ t[1][x>>8&255] ^ t[2][..] ^ t[3][..] */
static uint32_t shift_long[4][256];
static uint32_t shift_short[4][256];

static void build_shift_table(uint32_t table[4][256], size_t zeros)
{
    /* shift_L is linear: compute it on the 32 basis vectors, then XOR. */
    uint32_t basis[32];
    static const unsigned char zero_block[SHORT_BLOCK];
    for (int b = 0; b < 32; b++) {
        uint32_t c = 1u << b;
        for (size_t left = zeros; left; ) {
            size_t n = left < SHORT_BLOCK ? left : SHORT_BLOCK;
            c = sw_raw(c, zero_block, n);
            left -= n;
        }
        basis[b] = c;
    }
    for (int k = 0; k < 4; k++) {
        for (uint32_t n = 0; n < 256; n++) {
            uint32_t v = 0;
            for (int bit = 0; bit < 8; bit++)
                if (n & (1u << bit))
                    v ^= basis[8 * k + bit];
            table[k][n] = v;
        }
    }
}

static inline uint32_t apply_shift(uint32_t table[4][256], uint32_t x)
{
    return table[0][x & 0xff] ^ table[1][(x >> 8) & 0xff] ^
           table[2][(x >> 16) & 0xff] ^ table[3][x >> 24];
}

static inline uint64_t load64(const unsigned char *p)
{
    uint64_t w;
    memcpy(&w, p, 8);
    return w;
}

__attribute__((target("sse4.2")))
static uint32_t crc32c_update_hw(uint32_t crc, const void *buf, size_t len)
{
    const unsigned char *p = (const unsigned char *)buf;
    uint64_t c = (uint32_t)~crc;

    while (len && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        len--;
    }
    while (len >= 3 * LONG_BLOCK) {
        uint64_t c1 = 0, c2 = 0;
        const unsigned char *end = p + LONG_BLOCK;
        do {
            c = _mm_crc32_u64(c, load64(p));
            c1 = _mm_crc32_u64(c1, load64(p + LONG_BLOCK));
            c2 = _mm_crc32_u64(c2, load64(p + 2 * LONG_BLOCK));
            p += 8;
        } while (p < end);
        c = apply_shift(shift_long, (uint32_t)c) ^ (uint32_t)c1;
        c = apply_shift(shift_long, (uint32_t)c) ^ (uint32_t)c2;
        p += 2 * LONG_BLOCK;
        len -= 3 * LONG_BLOCK;
    }
    while (len >= 3 * SHORT_BLOCK) {
        uint64_t c1 = 0, c2 = 0;
        const unsigned char *end = p + SHORT_BLOCK;
        do {
            c = _mm_crc32_u64(c, load64(p));
            c1 = _mm_crc32_u64(c1, load64(p + SHORT_BLOCK));
            c2 = _mm_crc32_u64(c2, load64(p + 2 * SHORT_BLOCK));
            p += 8;
        } while (p < end);
        c = apply_shift(shift_short, (uint32_t)c) ^ (uint32_t)c1;
        c = apply_shift(shift_short, (uint32_t)c) ^ (uint32_t)c2;
        p += 2 * SHORT_BLOCK;
        len -= 3 * SHORT_BLOCK;
    }
    while (len >= 8) {
        c = _mm_crc32_u64(c, load64(p));
        p += 8;
        len -= 8;
    }
    while (len--)
        c = _mm_crc32_u8((uint32_t)c, *p++);
    return ~(uint32_t)c;
}

static int cpu_has_crc(void)
{
    __builtin_cpu_init(); /* required: we run from a constructor */
    return __builtin_cpu_supports("sse4.2");
}
#endif

__attribute__((constructor))
static void crc32c_global_init(void)
{
    const char *force_sw = getenv("KBROKER_CRC32C_SOFTWARE");
    build_sw_tables();
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (!(force_sw && force_sw[0] && strcmp(force_sw, "0") != 0) && cpu_has_crc()) {
        build_shift_table(shift_long, LONG_BLOCK);
        build_shift_table(shift_short, SHORT_BLOCK);
        crc32c_impl = crc32c_update_hw;
        hw_selected = 1;
    }
#else
    (void)force_sw;
#endif
}

uint32_t crc32c_update(uint32_t crc, const void *buf, size_t len)
{
    return crc32c_impl(crc, buf, len);
}

int crc32c_hw_available(void)
{
    return hw_selected;
}
