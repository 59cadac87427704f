/* src/dist/slurm.c — a world from SLURM's variables, for a program started
 * by `srun` without `accel launch` (and for `accel launch` inside an
 * allocation: the machines of the job).
 *
 * SLURM gives every task SLURM_PROCID (rank), SLURM_NTASKS (world),
 * SLURM_LOCALID, SLURM_NODEID and, compressed, the nodes of the step
 * (SLURM_STEP_NODELIST / SLURM_JOB_NODELIST: "node[01-03,07],gpu5") and its
 * tasks per node (SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE:
 * "2(x3),1"). Rank 0 runs on the first node of the list (SLURM's block
 * distribution), so that host is the main address.
 *
 * Only a task of an srun step is described by them: a program run by the
 * batch script itself (sbatch without srun) sees the job's SLURM_NTASKS and
 * SLURM_PROCID=0 too, but no SLURM_STEP_ID (Slurm's env.c sets it for steps
 * only), and runs as one process. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/slurm.h"

#include "core/env.h"

static const char *env_first(const char *a, const char *b) {
    const char *v = getenv(a);
    if (v && *v) return v;
    v = getenv(b);
    return v && *v ? v : NULL;
}

accel_status accel__slurm_first_host(const char *list, char *out, size_t n) {
    size_t o = 0;
    const char *p = list;
    if (!*p || *p == ',' || *p == '[')
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "SLURM node list '%s' does not start with a host name", list);
    while (*p && *p != ',') {
        char c = *p++;
        if (c == ']') return accel_set_error(ACCEL_ERR_INVALID_ARG, "SLURM node list '%s': unbalanced ']'", list);
        if (c == '[') { /* "[01-03,07]": its first number, as written (zero padding is part of the name) */
            const char *first = p;
            while (*p >= '0' && *p <= '9') p++;
            if (p == first || (*p != '-' && *p != ',' && *p != ']'))
                return accel_set_error(ACCEL_ERR_INVALID_ARG, "SLURM node list '%s': a range must start with a "
                                       "number", list);
            for (const char *d = first; d < p; d++)
                if (o + 1 < n) out[o++] = *d;
            while (*p && *p != ']') p++;
            if (*p != ']') return accel_set_error(ACCEL_ERR_INVALID_ARG, "SLURM node list '%s': unbalanced '['", list);
            p++;
            continue;
        }
        if (o + 1 < n) out[o++] = c;
    }
    if (o + 1 >= n) return accel_set_error(ACCEL_ERR_INVALID_ARG, "SLURM node list '%s': host name too long", list);
    out[o] = 0;
    return ACCEL_OK;
}

/* The whole list is checked, not only the entries up to `node`. */
accel_status accel__slurm_tasks_on_node(const char *tasks_per_node, int node, int *out) {
    const char *p = tasks_per_node;
    long seen = 0, found = -1;
    bool ok = *p != 0;
    while (ok && *p) {
        char *end;
        long tasks = strtol(p, &end, 10), times = 1;
        ok = end != p && tasks > 0 && *p >= '0' && *p <= '9';
        p = end;
        if (ok && *p == '(') {
            ok = p[1] == 'x' && p[2] >= '0' && p[2] <= '9';
            times = ok ? strtol(p + 2, &end, 10) : 0;
            ok = ok && times > 0 && *end == ')';
            p = ok ? end + 1 : p;
        }
        if (ok && found < 0 && node < seen + times) found = tasks;
        seen += times;
        if (ok && *p == ',') ok = *++p != 0;
        else if (ok && *p) ok = false;
    }
    if (ok && found > 0) {
        *out = (int)found;
        return ACCEL_OK;
    }
    return accel_set_error(ACCEL_ERR_INVALID_ARG, "SLURM tasks per node '%s' is malformed or has no entry for "
                           "SLURM_NODEID=%d", tasks_per_node, node);
}

/* slurmstepd sets the step id for every task of a step; the batch step
 * (and the interactive and extern ones) have special ids it leaves out. */
bool accel__slurm_in_step(void) { return env_first("SLURM_STEP_ID", "SLURM_STEPID") != NULL; }

bool accel__slurm_started(void) {
    const char *v = getenv("SLURM_PROCID");
    return v && *v && accel__slurm_in_step() && !getenv("RANK") && !getenv("PMI_RANK") &&
           !getenv("OMPI_COMM_WORLD_RANK");
}

accel_status accel__slurm_main_host(char *out, size_t n) {
    const char *list = env_first("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST");
    if (!list) return accel_set_error(ACCEL_ERR_INVALID_ARG, "SLURM_JOB_NODELIST is not set: cannot tell the main "
                                      "machine (set MASTER_ADDR)");
    return accel__slurm_first_host(list, out, n);
}

accel_status accel__slurm_local_world(int *out) {
    const char *tpn = env_first("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE");
    const char *node = getenv("SLURM_NODEID");
    if (!tpn || !node || !*node)
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "SLURM_TASKS_PER_NODE and SLURM_NODEID must be set to tell "
                               "how many tasks share this machine (or set LOCAL_WORLD_SIZE)");
    long id;
    if (accel__parse_long("SLURM_NODEID", node, 0, 1000000, &id) != ACCEL_OK) return accel_last_status();
    return accel__slurm_tasks_on_node(tpn, (int)id, out);
}

accel_status accel__slurm_job_port(long *out) {
    const char *job = getenv("SLURM_JOB_ID") ? "SLURM_JOB_ID" : "SLURM_JOBID";
    const char *step = getenv("SLURM_STEP_ID") ? "SLURM_STEP_ID" : "SLURM_STEPID";
    long job_id, step_id;
    if (!getenv(job) || !getenv(step))
        return accel_set_error(ACCEL_ERR_INVALID_ARG, "SLURM_JOB_ID and SLURM_STEP_ID must be set to derive this "
                               "job step's port (or set MASTER_PORT)");
    /* Step ids are below 2^32 - 6 (special steps: batch, extern, ...). */
    if (accel__parse_long(job, getenv(job), 0, 0xFFFFFFFFL, &job_id) != ACCEL_OK ||
        accel__parse_long(step, getenv(step), 0, 0xFFFFFFFFL, &step_id) != ACCEL_OK)
        return accel_last_status();
    *out = 15000 + (4 * job_id + step_id % 4) % 17000;
    return ACCEL_OK;
}
