/* src/cli/main.c — `accel <command> [args]`: the dispatch table. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

typedef struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} subcommand;

/* One row per subcommand. */
static const subcommand COMMANDS[] = {
    {"config", accel_cli_config, "Create or update a default_config.yaml (interactive, `default`, `update`)"},
    {"env", accel_cli_env, "Print environment information for bug reports"},
    {"estimate-memory", accel_cli_estimate_memory, "Estimate the memory needed to load a model (local config.json)"},
    {"launch", accel_cli_launch, "Launch a program on one or more processes"},
    {"merge-weights", accel_cli_merge_weights, "Merge a sharded checkpoint (safetensors or PyTorch shards) into one file"},
    {"test", accel_cli_test, "Run a short distributed self-check with a config"},
    {"to-fsdp2", accel_cli_to_fsdp2, "Convert an Accelerate config from FSDP1 to FSDP2"},
};
#define NCOMMANDS (sizeof COMMANDS / sizeof *COMMANDS)

static void usage(FILE *f) {
    fprintf(f, "usage: accel <command> [<args>]\n\naccel command line interface\n\npositional arguments:\n");
    for (size_t i = 0; i < NCOMMANDS; i++) fprintf(f, "  %-16s %s\n", COMMANDS[i].name, COMMANDS[i].help);
    fprintf(f, "\noptions:\n  -h, --help       show this help message and exit\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stdout);
        return 1;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (!strcmp(argv[1], COMMANDS[i].name)) return COMMANDS[i].run(argc - 1, argv + 1);
    fprintf(stderr, "accel: error: invalid choice: '%s' (choose from", argv[1]);
    for (size_t i = 0; i < NCOMMANDS; i++) fprintf(stderr, "%s'%s'", i ? ", " : " ", COMMANDS[i].name);
    fprintf(stderr, ")\n");
    usage(stderr);
    return 2;
}
