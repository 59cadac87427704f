/* The device mesh (mesh.h). */
#include <stdio.h>
#include <string.h>

#include "mesh.h"

static const char *const NAMES[ACCEL__MESH_DIMS] = {"pp", "dp_replicate", "dp_shard", "cp", "tp"};

const char *accel__mesh_dim_name(accel__mesh_dim d) {
    return d >= 0 && d < ACCEL__MESH_DIMS ? NAMES[d] : "?";
}

int accel__mesh_rank_at(const accel__mesh *m, const int coord[ACCEL__MESH_DIMS]) {
    int r = 0;
    for (int d = 0; d < ACCEL__MESH_DIMS; d++) r = r * m->size[d] + coord[d];
    return r;
}

/* "pp=1 x dp_replicate=2 x ..." into buf. */
static const char *describe(const int size[ACCEL__MESH_DIMS], char *buf, size_t n) {
    size_t at = 0;
    buf[0] = 0;
    for (int d = 0; d < ACCEL__MESH_DIMS && at < n; d++)
        at += (size_t)snprintf(buf + at, n - at, "%s%s=%d", d ? " x " : "", NAMES[d], size[d]);
    return buf;
}

/* The sizes with a -1 resolved; refused when they cannot cover world. */
static accel_status resolve(const int in[ACCEL__MESH_DIMS], int world, int out[ACCEL__MESH_DIMS]) {
    char b[256];
    int infer = -1;
    long long known = 1;
    for (int d = 0; d < ACCEL__MESH_DIMS; d++) {
        out[d] = in[d];
        if (in[d] == -1 && infer < 0) {
            infer = d;
        } else if (in[d] < 1) {
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel mesh: %s must be >= 1 (or one size -1: the rest of the "
                                   "world), got %d (%s)", NAMES[d], in[d], describe(in, b, sizeof b));
        } else if (in[d] > world / known) { /* known <= world: the product cannot overflow */
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel mesh: %s makes more processes than the world's %d",
                                   describe(in, b, sizeof b), world);
        } else {
            known *= in[d];
        }
    }
    if (infer >= 0) {
        if (known > world || world % known)
            return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel mesh: the world of %d processes does not divide into "
                                   "%s (the other sizes make %lld)", world, describe(in, b, sizeof b), known);
        out[infer] = (int)(world / known);
        known = world;
    }
    if (known != world)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel mesh: %s makes %lld processes, the world has %d",
                               describe(out, b, sizeof b), known, world);
    return ACCEL_OK;
}

accel_status accel__mesh_init(accel__mesh *m, accel_pg *pg, const int size[ACCEL__MESH_DIMS]) {
    memset(m, 0, sizeof *m);
    if (!pg) return accel_set_error(ACCEL_ERR_INVALID_ARG, "accel mesh: process group is NULL");
    m->world_pg = pg;
    m->world = accel_pg_size(pg);
    m->rank = accel_pg_rank(pg);
    accel_status st = resolve(size, m->world, m->size);
    if (st) return st;
    for (int d = ACCEL__MESH_DIMS - 1, r = m->rank; d >= 0; d--) {
        m->coord[d] = r % m->size[d];
        r /= m->size[d];
    }
    return ACCEL_OK;
}

accel_pg *accel__mesh_group(accel__mesh *m, accel__mesh_dim d) {
    if (d < 0 || d >= ACCEL__MESH_DIMS) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel mesh: no dimension %d", (int)d);
        return NULL;
    }
    if (m->group[d]) return m->group[d];
    if (m->size[d] == m->world) return m->group[d] = m->world_pg;
    int at[ACCEL__MESH_DIMS];
    memcpy(at, m->coord, sizeof at);
    at[d] = 0; /* the group's first rank names it */
    accel_pg *g = accel_pg_split(m->world_pg, accel__mesh_rank_at(m, at), m->coord[d]);
    if (!g) return NULL;
    if (accel_pg_size(g) != m->size[d] || accel_pg_rank(g) != m->coord[d]) {
        char b[256];
        accel_set_error(ACCEL_ERR_DIST, "accel mesh: rank %d's %s group has %d processes (its rank %d), the mesh %s "
                        "says %d (rank %d): the ranks disagree on the sizes", m->rank, NAMES[d], accel_pg_size(g),
                        accel_pg_rank(g), describe(m->size, b, sizeof b), m->size[d], m->coord[d]);
        accel_pg_free(g);
        return NULL;
    }
    return m->group[d] = g;
}

accel_pg *accel__mesh_group_over(accel__mesh *m, unsigned dims) {
    if (!dims || dims >= 1u << ACCEL__MESH_DIMS) {
        accel_set_error(ACCEL_ERR_INVALID_ARG, "accel mesh: no dimensions 0x%x", dims);
        return NULL;
    }
    if (!(dims & (dims - 1))) { /* one dimension */
        int d = 0;
        while (!(dims >> d & 1)) d++;
        return accel__mesh_group(m, (accel__mesh_dim)d);
    }
    if (m->span[dims]) return m->span[dims];
    /* Row-major over the chosen dimensions: the group's rank order is the
     * world's (the key), so its rank is this rank's index over them. */
    int at[ACCEL__MESH_DIMS], size = 1, index = 0;
    memcpy(at, m->coord, sizeof at);
    for (int d = 0; d < ACCEL__MESH_DIMS; d++)
        if (dims >> d & 1) {
            at[d] = 0;
            size *= m->size[d];
            index = index * m->size[d] + m->coord[d];
        }
    if (size == m->world) return m->span[dims] = m->world_pg;
    accel_pg *g = accel_pg_split(m->world_pg, accel__mesh_rank_at(m, at), m->rank);
    if (!g) return NULL;
    if (accel_pg_size(g) != size || accel_pg_rank(g) != index) {
        char b[256];
        accel_set_error(ACCEL_ERR_DIST, "accel mesh: rank %d's group over dimensions 0x%x has %d processes (its rank "
                        "%d), the mesh %s says %d (rank %d): the ranks disagree on the sizes", m->rank, dims,
                        accel_pg_size(g), accel_pg_rank(g), describe(m->size, b, sizeof b), size, index);
        accel_pg_free(g);
        return NULL;
    }
    return m->span[dims] = g;
}

void accel__mesh_free(accel__mesh *m) {
    for (int d = 0; d < ACCEL__MESH_DIMS; d++) {
        if (m->group[d] && m->group[d] != m->world_pg) accel_pg_free(m->group[d]);
        m->group[d] = NULL;
    }
    for (unsigned k = 0; k < 1u << ACCEL__MESH_DIMS; k++) {
        if (m->span[k] && m->span[k] != m->world_pg) accel_pg_free(m->span[k]);
        m->span[k] = NULL;
    }
}
