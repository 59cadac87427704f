/* src/dist/slurm.h — SLURM's job variables (internal to dist/ and the CLI). */
#ifndef ACCEL_DIST_SLURM_H
#define ACCEL_DIST_SLURM_H

#include <stdbool.h>
#include <stddef.h>

#include "accel/core.h"

/* The first host of a compressed node list: "node[01-03,07],gpu5" ->
 * "node01"; "gpu5,node1" -> "gpu5"; "rack1-[2-4]-ib" -> "rack1-2-ib".
 * Malformed (empty, unbalanced brackets, a range not starting with a number)
 * or longer than n - 1: an error quoting the list. */
accel_status accel__slurm_first_host(const char *list, char *out, size_t n);
/* Tasks on node `node` (0-based) of "2(x3),1": 2 for nodes 0-2, 1 for node 3. */
accel_status accel__slurm_tasks_on_node(const char *tasks_per_node, int node, int *out);
/* The process is a task of an srun step: SLURM_STEP_ID (or SLURM_STEPID)
 * is set. The batch script of sbatch, salloc's shell and the interactive
 * step also see the job's SLURM_NTASKS, SLURM_PROCID=0 ..., but no step id:
 * there SLURM's variables describe the allocation, not this process. */
bool accel__slurm_in_step(void);
/* The process was started by srun: a task of a step with SLURM_PROCID, and
 * no launcher's (RANK) or MPI's rank variables, which take precedence. */
bool accel__slurm_started(void);
/* The main machine: the first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST). */
accel_status accel__slurm_main_host(char *out, size_t n);
/* The tasks on this machine: SLURM_STEP_TASKS_PER_NODE (else
 * SLURM_TASKS_PER_NODE) at SLURM_NODEID. */
accel_status accel__slurm_local_world(int *out);
/* The rendezvous port of this job step when no MASTER_PORT is given: two
 * jobs sharing a node must not both take 29500. As Lightning derives its
 * port from SLURM_JOB_ID: 15000 + (4 * SLURM_JOB_ID + SLURM_STEP_ID mod 4)
 * mod 17000, below Linux's ephemeral ports (32768-60999), distinct for 4
 * concurrent steps of a job and for 4250 consecutive jobs. Malformed or
 * missing ids: an error naming the variable. */
accel_status accel__slurm_job_port(long *out);

#endif
