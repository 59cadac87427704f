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

static const char *slot_name(uint16_t tag) {
    static const char *const names[8] = {"?", "barrier", "all_reduce", "broadcast", "all_gatherv",
                                         "reduce_scatter", "?", "?"};
    return names[tag >> 13];
}

accel_status accel__op_mismatch(const accel_pg *pg, int peer, uint16_t mine, uint16_t theirs) {
    bool same_slot = mine >> 13 == theirs >> 13;
    return accel_set_error(ACCEL_ERR_DIST,
                           "accel dist: mismatched collectives: rank %d called %s while rank %d is in %s%s (every rank "
                           "must call the same collectives in the same order with the same arguments; "
                           "ACCEL_DEBUG_MODE=1 names each rank's call)",
                           pg->rank, pg->op_desc, peer, slot_name(theirs), same_slot ? " with other arguments" : "");
}
