/* src/dist/optag.c — the collective tags the backends compare across ranks. */
#include "dist/backend.h"

static uint64_t mix(uint64_t x) { /* splitmix64's finaliser */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint16_t accel__op_tag(accel__slot slot, uint64_t a, uint64_t b) {
    return (uint16_t)(((unsigned)slot << 13) | (mix(a ^ mix(b + 0x9e3779b97f4a7c15ull)) & 0x1fff));
}

uint16_t accel__gatherv_tag(const size_t *bytes, int world, int root) {
    uint64_t h = 0;
    for (int k = 0; k < world; k++) h = mix(h ^ bytes[k]);
    return accel__op_tag(ACCEL__SLOT_ALL_GATHERV, h, (uint64_t)(root + 1));
}

uint16_t accel__call_digest(const accel__site *site) {
    return (uint16_t)mix(site->count ^ mix((uint64_t)site->kind << 8 | site->dtype));
}
