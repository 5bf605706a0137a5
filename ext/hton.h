/* Big-endian (network order) loads and stores at any alignment.
 * memcpy keeps unaligned access defined; compilers lower it to a plain
 * mov + bswap. Kafka's wire and disk formats are big-endian throughout. */
#ifndef KBROKER_HTON_H
#define KBROKER_HTON_H

#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define KB_BE16(x) (x)
#define KB_BE32(x) (x)
#define KB_BE64(x) (x)
#else
#define KB_BE16(x) __builtin_bswap16(x)
#define KB_BE32(x) __builtin_bswap32(x)
#define KB_BE64(x) __builtin_bswap64(x)
#endif

static inline uint16_t load_be16(const char *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return KB_BE16(v);
}

static inline uint32_t load_be32(const char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return KB_BE32(v);
}

static inline uint64_t load_be64(const char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return KB_BE64(v);
}

static inline void store_be16(char *p, uint16_t v)
{
    v = KB_BE16(v);
    memcpy(p, &v, 2);
}

static inline void store_be32(char *p, uint32_t v)
{
    v = KB_BE32(v);
    memcpy(p, &v, 4);
}

static inline void store_be64(char *p, uint64_t v)
{
    v = KB_BE64(v);
    memcpy(p, &v, 8);
}

#endif
