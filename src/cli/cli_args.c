/* src/cli/cli_args.c — option parsing shared by the subcommands. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

void cli_print_help(const char *usage, const char *desc, const cli_opt *opts, int nopts) {
    printf("usage: %s\n\n%s\n\noptions:\n  -h, --help            show this help message and exit\n", usage, desc);
    for (int i = 0; i < nopts; i++) {
        char left[96];
        int o = 0;
        if (opts[i].short_name) o = snprintf(left, sizeof left, "-%c, ", opts[i].short_name);
        snprintf(left + o, sizeof left - (size_t)o, "--%s%s%s", opts[i].name, opts[i].takes_value ? " " : "",
                 opts[i].takes_value ? opts[i].meta : "");
        printf("  %-22s%s%s\n", left, strlen(left) > 21 ? "\n                        " : "", opts[i].help);
    }
}

int cli_idx(const cli_opt *opts, int nopts, const char *name) {
    for (int i = 0; i < nopts; i++)
        if (!strcmp(opts[i].name, name)) return i;
    fprintf(stderr, "accel: internal error: no option %s\n", name);
    abort();
}

int cli_parse(const char *usage, const char *desc, const cli_opt *opts, int nopts, int argc, char **argv,
              const char **vals, int *first_pos, bool stop_at_positional) {
    for (int i = 0; i < nopts; i++) vals[i] = NULL;
    *first_pos = argc;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            cli_print_help(usage, desc, opts, nopts);
            return CLI_HELP;
        }
        if (!strcmp(a, "--")) {
            if (*first_pos == argc) *first_pos = i + 1;
            break;
        }
        if (a[0] != '-' || a[1] == 0) {
            if (stop_at_positional) {
                *first_pos = i;
                return CLI_OK;
            }
            fprintf(stderr, "usage: %s\naccel: error: unrecognized arguments: %s\n", usage, a);
            return CLI_ERROR;
        }
        int k = -1;
        const char *value = NULL;
        if (a[1] == '-') {
            char name[128];
            const char *eq = strchr(a + 2, '=');
            size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
            if (len >= sizeof name) len = sizeof name - 1;
            memcpy(name, a + 2, len);
            name[len] = 0;
            for (char *c = name; *c; c++)
                if (*c == '-') *c = '_';
            for (int j = 0; j < nopts; j++)
                if (!strcmp(opts[j].name, name)) k = j;
            if (eq) value = eq + 1;
        } else if (a[2] == 0) {
            for (int j = 0; j < nopts; j++)
                if (opts[j].short_name == a[1]) k = j;
        }
        if (k < 0) {
            fprintf(stderr, "usage: %s\naccel: error: unrecognized arguments: %s\n", usage, a);
            return CLI_ERROR;
        }
        if (opts[k].takes_value) {
            if (!value) {
                if (i + 1 >= argc) {
                    fprintf(stderr, "usage: %s\naccel: error: argument --%s: expected one argument\n", usage,
                            opts[k].name);
                    return CLI_ERROR;
                }
                value = argv[++i];
            }
        } else if (value) {
            fprintf(stderr, "usage: %s\naccel: error: argument --%s: ignored explicit argument '%s'\n", usage,
                    opts[k].name, value);
            return CLI_ERROR;
        } else {
            value = "1";
        }
        vals[k] = value;
    }
    return CLI_OK;
}
