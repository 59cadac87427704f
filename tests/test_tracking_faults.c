/* The trackers under faults and hostile input: a failed CSV rewrite (its tmp
 * name taken, the file size limit reached, the log gone from its directory)
 * and logging after it, a run stopped holding the trackers' locks, long
 * non-ASCII text tags, hparams.yml strings that YAML would read as something
 * else. Every file written must stay readable by its peer's parser. */
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "accel/accel.h"
#include "check.h"
#include "core/afile.h"
#include "test_files.h"
#include "tb_event.pb-c.h"
#include "tracking/tb_internal.h"

static char *temp_dir(void) {
    static char dirs[8][64];
    static int n;
    char *d = dirs[n++ % 8];
    snprintf(d, 64, "/tmp/accel_track_faults_XXXXXX");
    return mkdtemp(d);
}

static bool exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* The path of the one events file in dir (false when not exactly one). */
static bool events_file(const char *dir, char *out, size_t n) {
    DIR *d = opendir(dir);
    int found = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (!strncmp(e->d_name, "events.out.tfevents.", 20)) snprintf(out, n, "%s/%s", dir, e->d_name), found++;
    if (d) closedir(d);
    return found == 1;
}

/* The events of a TFRecord file, both CRCs checked; their count, -1 when the
 * file is not whole records. */
static int read_events(const char *path, AccelTb__Event **ev, int max) {
    void *data;
    size_t len;
    if (accel_load_bytes(path, &data, &len)) return -1;
    const uint8_t *p = data, *end = p + len;
    int k = 0;
    while (p < end && k < max) {
        uint64_t n = 0;
        uint32_t lc = 0, dc = 0;
        if (end - p < 12) break;
        for (int i = 0; i < 8; i++) n |= (uint64_t)p[i] << (8 * i);
        for (int i = 0; i < 4; i++) lc |= (uint32_t)p[8 + i] << (8 * i);
        if (lc != accel__crc32c_masked(p, 8) || (uint64_t)(end - p) < 16 + n) break;
        for (int i = 0; i < 4; i++) dc |= (uint32_t)p[12 + n + i] << (8 * i);
        if (dc != accel__crc32c_masked(p + 12, n) || !(ev[k] = accel_tb__event__unpack(NULL, n, p + 12))) break;
        k++;
        p += 16 + n;
    }
    bool whole = p == end;
    free(data);
    if (!whole)
        while (k) accel_tb__event__free_unpacked(ev[--k], NULL);
    return whole ? k : -1;
}

static void free_events(AccelTb__Event **ev, int n) {
    for (int i = 0; i < n; i++) accel_tb__event__free_unpacked(ev[i], NULL);
}

static const char *tag_of(const AccelTb__Event *e) {
    return e->what_case == ACCEL_TB__EVENT__WHAT_SUMMARY && e->summary->n_value == 1 ? e->summary->value[0]->tag
                                                                                      : NULL;
}

/* ---------------------------------------------------------------- tensorboard */

/* add_text's tag is "<key>/text_summary" whatever the key's length: it was
 * cut to 511 bytes, and a cut inside a UTF-8 sequence (here after 255 and a
 * half "é") made TensorBoard's reader refuse the file ("String field had bad
 * UTF-8"). */
static void test_tb_long_text_tag(void) {
    char *dir = temp_dir(), run[512], path[1024], key[1300] = "", tag[1400];
    for (int i = 0; i < 600; i++) strcat(key, "\xc3\xa9"); /* 1200 bytes of "é" */
    snprintf(tag, sizeof tag, "%s/text_summary", key);
    accel_tracker *t = accel_tracker_open("tensorboard", "p", dir);
    accel_value v[] = {ACCEL_VALUE_S(key, "text"), ACCEL_VALUE_F(key, 1.5)};
    CHECK(accel_tracker_log(t, 2, v, 1) == ACCEL_OK);
    CHECK(accel_tracker_finish(t) == ACCEL_OK);
    snprintf(run, sizeof run, "%s/p", dir);
    AccelTb__Event *ev[8];
    int n = events_file(run, path, sizeof path) ? read_events(path, ev, 8) : -1;
    CHECK(n == 3); /* file_version, the text, the scalar */
    if (n == 3) {
        CHECK(tag_of(ev[1]) && !strcmp(tag_of(ev[1]), tag));
        CHECK(tag_of(ev[2]) && !strcmp(tag_of(ev[2]), key));
    }
    free_events(ev, n);
    rm_rf(dir);
}

/* Runs log(t, ...) with files limited to `limit` bytes (EFBIG, as a full
 * disk's ENOSPC); the limit and SIGXFSZ are restored after. */
static accel_status log_limited(accel_tracker *t, int n, const accel_value *v, int64_t step, off_t limit) {
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = (rlim_t)limit;
    void (*was)(int) = signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &lim);
    accel_status st = accel_tracker_log(t, n, v, step);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, was);
    return st;
}

/* A log call whose write is cut short (disk full) must not leave half a
 * record: TensorBoard's reader stops at the first broken one, so every event
 * logged after the handled error was lost. The file stays whole records,
 * the failed call's events are not in it, later calls' are. */
static void test_tb_log_after_disk_full(void) {
    char *dir = temp_dir(), run[512], path[1024];
    accel_tracker *t = accel_tracker_open("tensorboard", "p", dir);
    accel_value v[] = {ACCEL_VALUE_F("loss", 1.5), ACCEL_VALUE_S("note", "a text long enough to be cut")};
    CHECK(accel_tracker_log(t, 2, v, 0) == ACCEL_OK);
    snprintf(run, sizeof run, "%s/p", dir);
    struct stat sb;
    CHECK(events_file(run, path, sizeof path) && stat(path, &sb) == 0);
    CHECK(log_limited(t, 2, v, 1, sb.st_size + 40) == ACCEL_ERR_IO); /* the scalar fits, the text does not */
    CHECK_STR_CONTAINS(accel_last_error(), "cannot write an event to");
    accel_clear_error();
    CHECK(accel_tracker_log(t, 2, v, 2) == ACCEL_OK);
    CHECK(accel_tracker_finish(t) == ACCEL_OK);
    AccelTb__Event *ev[8];
    int n = read_events(path, ev, 8);
    CHECK_MSG(n == 5, "%d events", n); /* file_version, step 0's two, step 2's two */
    if (n == 5) CHECK(ev[1]->step == 0 && ev[2]->step == 0 && ev[3]->step == 2 && ev[4]->step == 2);
    free_events(ev, n);
    rm_rf(dir);
}

/* The same for the jsonl and csv trackers: half a line stayed and the next
 * line was glued to it ({"step":1,"loss":1.5,"no{"step":2,...}), which a
 * JSON-lines or CSV reader refuses, losing the record logged after the
 * handled error. The failed call's line is not in the file, the next is. */
static void test_text_log_after_disk_full(void) {
    static const char *const want[] = {
        "{\"step\":0,\"loss\":1.5,\"note\":\"a text long enough to be cut\"}\n"
        "{\"step\":2,\"loss\":1.5,\"note\":\"a text long enough to be cut\"}\n",
        "step,loss,note\n0,1.5,a text long enough to be cut\n2,1.5,a text long enough to be cut\n",
    };
    static const char *const names[] = {"jsonl", "csv"}, *const files[] = {"log.jsonl", "log.csv"};
    for (int k = 0; k < 2; k++) {
        char *dir = temp_dir(), path[512];
        snprintf(path, sizeof path, "%s/p/%s", dir, files[k]);
        accel_tracker *t = accel_tracker_open(names[k], "p", dir);
        accel_value v[] = {ACCEL_VALUE_F("loss", 1.5), ACCEL_VALUE_S("note", "a text long enough to be cut")};
        CHECK(accel_tracker_log(t, 2, v, 0) == ACCEL_OK);
        struct stat sb;
        CHECK(stat(path, &sb) == 0);
        CHECK(log_limited(t, 2, v, 1, sb.st_size + 12) == ACCEL_ERR_IO);
        CHECK_STR_CONTAINS(accel_last_error(), files[k]);
        accel_clear_error();
        CHECK(accel_tracker_log(t, 2, v, 2) == ACCEL_OK);
        CHECK(accel_tracker_finish(t) == ACCEL_OK);
        char *s = slurp(path);
        CHECK_MSG(s && !strcmp(s, want[k]), "%s: %s", names[k], s);
        free(s);
        rm_rf(dir);
    }
}

/* A csv tracker's first row is written with its header, as one write: a
 * first log without values wrote a headerless row, and the header came
 * second when keys appeared. */
static void test_csv_header_first(void) {
    char *dir = temp_dir(), path[512];
    snprintf(path, sizeof path, "%s/p/log.csv", dir);
    accel_tracker *t = accel_tracker_open("csv", "p", dir);
    accel_value a[] = {ACCEL_VALUE_F("a", 1)};
    CHECK(accel_tracker_log(t, 0, NULL, 0) == ACCEL_OK);
    CHECK(accel_tracker_log(t, 1, a, 1) == ACCEL_OK);
    CHECK(accel_tracker_finish(t) == ACCEL_OK);
    char *s = slurp(path);
    CHECK_MSG(s && !strcmp(s, "step,a\n0,\n1,1.0\n"), "%s", s);
    free(s);
    rm_rf(dir);
}

/* The path of the tensorboard tracker's hparams.yml of project "p" under dir (in its <time.time()> sub-run). */
static void hparams_path(const char *dir, char *path, size_t n) {
    char run[512], sub[1024] = "";
    snprintf(run, sizeof run, "%s/p", dir);
    DIR *d = opendir(run);
    for (struct dirent *e; d && (e = readdir(d));)
        if (e->d_name[0] >= '1' && e->d_name[0] <= '9') snprintf(sub, sizeof sub, "%s/%s", run, e->d_name);
    if (d) closedir(d);
    snprintf(path, n, "%s/hparams.yml", sub);
}

/* Its text, or NULL; the caller frees it. */
static char *hparams_of(const char *dir) {
    char path[1100];
    hparams_path(dir, path, sizeof path);
    return slurp(path);
}

/* hparams.yml quotes what yaml.dump quotes: every string (key or value)
 * that PyYAML's resolvers would read as a bool, number, date, null, merge
 * key or `=`. Only number-like and a few words were: "1:20" came back as
 * 80, "2024-01-01" as a date, the key "123" as an int, and "=" made
 * yaml.safe_load refuse the file. The expected text is yaml.dump's for the
 * same dict (Python 3.11, PyYAML 6.0.3). */
static void test_hparams_yml_quotes_as_pyyaml(void) {
    char *dir = temp_dir();
    accel_tracker *t = accel_tracker_open("tensorboard", "p", dir);
    accel_value cfg[] = {
        ACCEL_VALUE_S("a", "1:20"), ACCEL_VALUE_S("b", "2024-01-01"), ACCEL_VALUE_S("c", "2024-1-1 10:20:30.5 +01:00"),
        ACCEL_VALUE_S("d", "0b101"), ACCEL_VALUE_S("e", "1_000"), ACCEL_VALUE_S("f", "+.inf"),
        ACCEL_VALUE_S("g", "="), ACCEL_VALUE_S("h", "<<"), ACCEL_VALUE_S("i", "Yes"),
        ACCEL_VALUE_S("j", "1e400"), ACCEL_VALUE_S("k", "yEs"), ACCEL_VALUE_S("l", "3 apples"),
        ACCEL_VALUE_S("m", "0x1F"), ACCEL_VALUE_I("123", 1), ACCEL_VALUE_I("true", 2), ACCEL_VALUE_I("=", 3),
    };
    CHECK(accel_tracker_store_init_configuration(t, (int)(sizeof cfg / sizeof *cfg), cfg) == ACCEL_OK);
    CHECK(accel_tracker_finish(t) == ACCEL_OK);
    char *y = hparams_of(dir);
    CHECK_MSG(y && !strcmp(y, "'123': 1\n'=': 3\na: '1:20'\nb: '2024-01-01'\nc: '2024-1-1 10:20:30.5 +01:00'\n"
                              "d: '0b101'\ne: '1_000'\nf: '+.inf'\ng: '='\nh: '<<'\ni: 'Yes'\nj: 1e400\nk: yEs\n"
                              "l: 3 apples\nm: '0x1F'\n'true': 2\n"),
              "%s", y);
    free(y);
    rm_rf(dir);
}

/* hparams.yml goes through the atomic writer (core/afile.h), as every file
 * accel writes whole: fopen("w") wrote it in place, created 0666 less the
 * umask (the writer creates 0644 less the umask, so under umask 0 the mode
 * tells which wrote it), half a file left on a failed write. */
static void test_hparams_yml_through_writer(void) {
    char *dir = temp_dir(), path[1100];
    mode_t was = umask(0);
    accel_tracker *t = accel_tracker_open("tensorboard", "p", dir);
    accel_value cfg[] = {ACCEL_VALUE_I("a", 1)};
    CHECK(accel_tracker_store_init_configuration(t, 1, cfg) == ACCEL_OK);
    CHECK(accel_tracker_finish(t) == ACCEL_OK);
    umask(was);
    hparams_path(dir, path, sizeof path);
    struct stat sb;
    CHECK_MSG(stat(path, &sb) == 0 && (sb.st_mode & 0777) == 0644, "%s: mode %o", path, (unsigned)sb.st_mode & 0777);
    rm_rf(dir);
}

/* Floats are written as Python writes them: csv.writer's str() (repr) and
 * yaml.dump's repr with ".0" before a bare exponent. printf's %g wrote 1.0
 * as "1" (an int to a reader of hparams.yml) and 1e-05 as "1e-05" (a string
 * to YAML 1.1). The expected texts are Python 3.11's and PyYAML 6.0.3's. */
static void test_floats_written_as_python(void) {
    static const double v[] = {1.0, 1e-05, 1e16, 1.5e16, 1e15, 0.0001, -0.0, 0.30000000000000004, 5e-324};
    enum { N = sizeof v / sizeof *v };
    accel_value row[N];
    char keys[N][2];
    for (int i = 0; i < N; i++) {
        keys[i][0] = (char)('a' + i), keys[i][1] = '\0';
        row[i] = ACCEL_VALUE_F(keys[i], v[i]);
    }
    char *dir = temp_dir(), path[1100];
    accel_tracker *csv = accel_tracker_open("csv", "p", dir), *tb = accel_tracker_open("tensorboard", "p", dir);
    CHECK(accel_tracker_log(csv, N, row, 0) == ACCEL_OK);
    CHECK(accel_tracker_store_init_configuration(tb, N, row) == ACCEL_OK);
    CHECK(accel_tracker_finish(csv) == ACCEL_OK && accel_tracker_finish(tb) == ACCEL_OK);
    snprintf(path, sizeof path, "%s/p/log.csv", dir);
    char *s = slurp(path);
    CHECK_MSG(s && !strcmp(s, "step,a,b,c,d,e,f,g,h,i\n"
                              "0,1.0,1e-05,1e+16,1.5e+16,1000000000000000.0,0.0001,-0.0,0.30000000000000004,5e-324\n"),
              "%s", s);
    free(s);
    char *y = hparams_of(dir);
    CHECK_MSG(y && !strcmp(y, "a: 1.0\nb: 1.0e-05\nc: 1.0e+16\nd: 1.5e+16\ne: 1000000000000000.0\nf: 0.0001\n"
                              "g: -0.0\nh: 0.30000000000000004\ni: 5.0e-324\n"),
              "%s", y);
    free(y);
    rm_rf(dir);
}

/* ---------------------------------------------------------------- csv */

/* A new key rewrites log.csv through log.csv.tmp. When that fails the
 * tracker must keep logging, with the old header and rows of its width: the
 * columns stayed added (rows wider than the header, the new key never named)
 * and, when the failure came at the rename, the stream was closed and set to
 * NULL (the next log crashed). */
static const accel_value A1[] = {ACCEL_VALUE_F("a", 1)}, AB[] = {ACCEL_VALUE_F("a", 2), ACCEL_VALUE_F("b", 3)};

/* A csv tracker in a new folder (*dir) holding log.csv (path; tmp its
 * log.csv.tmp) with one row of "a" at step 0. */
static accel_tracker *csv_one_row(char **dir, char *path, char *tmp) {
    *dir = temp_dir();
    snprintf(path, 512, "%s/p/log.csv", *dir);
    snprintf(tmp, 520, "%s.tmp", path);
    accel_tracker *t = accel_tracker_open("csv", "p", *dir);
    CHECK(accel_tracker_log(t, 1, A1, 0) == ACCEL_OK);
    return t;
}

static void test_csv_widen_fails_tmp_taken(void) {
    char *dir, path[512], tmp[520];
    accel_tracker *t = csv_one_row(&dir, path, tmp);
    const accel_value *a = A1, *ab = AB;
    CHECK(mkdir(tmp, 0777) == 0); /* the tmp name is taken */
    CHECK(accel_tracker_log(t, 2, ab, 1) == ACCEL_ERR_IO);
    CHECK_STR_CONTAINS(accel_last_error(), "log.csv.tmp");
    accel_clear_error();
    CHECK(accel_tracker_log(t, 1, a, 2) == ACCEL_OK); /* as wide as the header */
    CHECK(rmdir(tmp) == 0);
    CHECK(accel_tracker_log(t, 2, ab, 3) == ACCEL_OK); /* widens now */
    CHECK(accel_tracker_finish(t) == ACCEL_OK);
    char *s = slurp(path);
    CHECK_MSG(s && !strcmp(s, "step,a,b\n0,1.0,\n2,1.0,\n3,2.0,3.0\n"), "%s", s);
    free(s);
    rm_rf(dir);
}

/* The user's own log.csv.tmp (not made by accel: no mark), `mine`: widening
 * fails naming it, it keeps every byte and log.csv its rows (the widening
 * truncated it, then renamed it over log.csv); once moved away, the tracker
 * widens. */
static void check_csv_user_tmp_kept(const char *what, const char *mine) {
    char *dir, path[512], tmp[520], moved[520];
    accel_tracker *t = csv_one_row(&dir, path, tmp);
    FILE *f = fopen(tmp, "wb");
    CHECK(f && fputs(mine, f) >= 0 && fclose(f) == 0);
    CHECK_MSG(accel_tracker_log(t, 2, AB, 1) == ACCEL_ERR_IO, "%s: widened through the user's %s", what, tmp);
    const char *err = accel_last_error();
    CHECK_MSG(strstr(err, "cannot rewrite") && strstr(err, tmp) && strstr(err, "is not a scratch file of this user's accel"), "%s: %s", what,
              err);
    accel_clear_error();
    char *s = slurp(tmp);
    CHECK_MSG(s && !strcmp(s, mine), "%s: the user's tmp now %s", what, s ? s : "(gone)");
    free(s);
    s = slurp(path);
    CHECK_MSG(s && !strcmp(s, "step,a\n0,1.0\n"), "%s: log.csv now %s", what, s ? s : "(gone)");
    free(s);
    snprintf(moved, sizeof moved, "%s/mine", dir);
    CHECK(rename(tmp, moved) == 0);
    CHECK(accel_tracker_log(t, 2, AB, 2) == ACCEL_OK);
    CHECK(accel_tracker_finish(t) == ACCEL_OK);
    s = slurp(path);
    CHECK_MSG(s && !strcmp(s, "step,a,b\n0,1.0,\n2,2.0,3.0\n"), "%s: %s", what, s ? s : "(gone)");
    free(s);
    rm_rf(dir);
}

static void test_csv_widen_keeps_user_tmp(void) {
    check_csv_user_tmp_kept("3 bytes", "abc");
    check_csv_user_tmp_kept("empty", "");
}

/* A log.csv.tmp left by an accel writer killed -9 mid-write (marked as
 * accel's): the widening reuses it, leaves none behind, and log.csv loses
 * the mark. */
static void test_csv_widen_reuses_killed_writers_tmp(void) {
    char *dir, path[512], tmp[520];
    accel_tracker *t = csv_one_row(&dir, path, tmp);
    pid_t kid = fork();
    if (kid == 0) {
        accel__afile f;
        if (accel__afile_open(&f, path) != ACCEL_OK || accel__afile_write(&f, "step,", 5) != ACCEL_OK) _exit(1);
        raise(SIGKILL);
    }
    int ws = 0;
    CHECK(waitpid(kid, &ws, 0) == kid && WIFSIGNALED(ws));
    CHECK(exists(tmp));
    CHECK_MSG(accel_tracker_log(t, 2, AB, 1) == ACCEL_OK, "%s", accel_last_error());
    CHECK(!exists(tmp));
    CHECK(accel_tracker_log(t, 2, AB, 2) == ACCEL_OK); /* appended to the new file */
    CHECK(accel_tracker_finish(t) == ACCEL_OK);
    char *s = slurp(path);
    CHECK_MSG(s && !strcmp(s, "step,a,b\n0,1.0,\n1,2.0,3.0\n2,2.0,3.0\n"), "%s", s ? s : "(gone)");
    free(s);
    struct stat sb;
    CHECK_MSG(stat(path, &sb) == 0 && !(sb.st_mode & S_ISVTX), "log.csv kept the scratch mark: %o", (unsigned)sb.st_mode);
    rm_rf(dir);
}

static void test_csv_widen_fails_file_too_large(void) {
    char *dir, path[512], tmp[520];
    accel_tracker *t = csv_one_row(&dir, path, tmp);
    const accel_value *a = A1, *ab = AB;
    CHECK(accel_tracker_log(t, 1, a, 1) == ACCEL_OK);
    /* Files may not grow past log.csv's size: the wider copy cannot be written. */
    struct stat sb;
    CHECK(stat(path, &sb) == 0);
    CHECK(log_limited(t, 2, ab, 2, sb.st_size) == ACCEL_ERR_IO);
    CHECK_STR_CONTAINS(accel_last_error(), "cannot rewrite");
    CHECK(!exists(tmp)); /* no half copy left behind */
    accel_clear_error();
    CHECK(accel_tracker_log(t, 1, a, 3) == ACCEL_OK); /* the tracker still writes */
    CHECK(accel_tracker_log(t, 2, ab, 4) == ACCEL_OK);
    CHECK(accel_tracker_finish(t) == ACCEL_OK);
    char *s = slurp(path);
    CHECK_MSG(s && !strcmp(s, "step,a,b\n0,1.0,\n1,1.0,\n3,1.0,\n4,2.0,3.0\n"), "%s", s);
    free(s);
    rm_rf(dir);
}

/* Two runs sharing project_dir and project name: run 2's start moves run
 * 1's live log.csv aside (log.1.csv); run 1's widening (a new column) then
 * rewrote log.csv, run 2's, from the name, took it over, and run 2's rows
 * went on to an unlinked file. Now each run's rows stay in its own file:
 * run 1 widens log.1.csv (twice: the kept descriptor reads back), run 2's
 * log.csv holds its five rows. */
static void test_csv_two_runs_one_directory(void) {
    char *dir = temp_dir(), mine[512], theirs[512];
    snprintf(theirs, sizeof theirs, "%s/p/log.csv", dir);
    snprintf(mine, sizeof mine, "%s/p/log.1.csv", dir);
    accel_tracker *a = accel_tracker_open("csv", "p", dir);
    for (int s = 0; s < 2; s++) CHECK(accel_tracker_log(a, 1, (accel_value[]){ACCEL_VALUE_F("loss", 1.0 + s)}, s) == 0);
    accel_tracker *b = accel_tracker_open("csv", "p", dir); /* run 2 starts: run 1's log.csv moved aside */
    for (int s = 0; s < 2; s++) CHECK(accel_tracker_log(b, 1, (accel_value[]){ACCEL_VALUE_F("loss", 100.0 + s)}, s) == 0);
    accel_value wider[] = {ACCEL_VALUE_F("loss", 3.0), ACCEL_VALUE_F("acc", 0.5)};
    CHECK_MSG(accel_tracker_log(a, 2, wider, 2) == ACCEL_OK, "%s", accel_last_error());
    for (int s = 2; s < 5; s++) CHECK(accel_tracker_log(b, 1, (accel_value[]){ACCEL_VALUE_F("loss", 100.0 + s)}, s) == 0);
    accel_value widest[] = {ACCEL_VALUE_F("loss", 4.0), ACCEL_VALUE_I("epoch", 1)};
    CHECK_MSG(accel_tracker_log(a, 2, widest, 3) == ACCEL_OK, "%s", accel_last_error());
    CHECK(accel_tracker_finish(a) == ACCEL_OK);
    CHECK(accel_tracker_finish(b) == ACCEL_OK);
    char *s = slurp(mine);
    CHECK_MSG(s && !strcmp(s, "step,loss,acc,epoch\n0,1.0,,\n1,2.0,,\n2,3.0,0.5,\n3,4.0,,1\n"), "run 1's: %s", s);
    free(s);
    s = slurp(theirs);
    CHECK_MSG(s && !strcmp(s, "step,loss\n0,100.0\n1,101.0\n2,102.0\n3,103.0\n4,104.0\n"), "run 2's: %s", s);
    free(s);
    rm_rf(dir);
}

/* The run's log.csv removed, or replaced by another program's file, while
 * the run logs: a widening finds no name in the directory for its file and
 * fails as the other failed widenings do ("cannot rewrite <log> with the new
 * columns: <why>"); the file called log.csv now, another's, is left byte for
 * byte (rewritten under that name with this run's rows, it was lost). */
static void test_csv_widen_log_gone(void) {
    for (int replaced = 0; replaced < 2; replaced++) {
        char *dir, path[512], tmp[520], other[530];
        accel_tracker *t = csv_one_row(&dir, path, tmp);
        if (replaced) {
            snprintf(other, sizeof other, "%s.other", path);
            FILE *f = fopen(other, "w");
            CHECK(f && fputs("not this run's\n", f) >= 0 && fclose(f) == 0);
            CHECK(rename(other, path) == 0);
        } else CHECK(unlink(path) == 0);
        CHECK(accel_tracker_log(t, 2, AB, 1) == ACCEL_ERR_IO);
        const char *err = accel_last_error();
        CHECK_MSG(strstr(err, "csv tracker: cannot rewrite ") && strstr(err, path) &&
                      strstr(err, "with the new columns: it is no longer this run's log and no name in"),
                  "replaced %d: %s", replaced, err);
        accel_clear_error();
        char *s = slurp(path);
        if (replaced) CHECK_MSG(s && !strcmp(s, "not this run's\n"), "log.csv now %s", s ? s : "(gone)");
        else CHECK_MSG(!s, "log.csv made again: %s", s);
        free(s);
        CHECK(!exists(tmp));
        CHECK(accel_tracker_finish(t) == ACCEL_OK);
        rm_rf(dir);
    }
}

/* ---------------------------------------------------------------- locks */

/* A process that takes an flock of each of paths (files or directories) and
 * stops itself, as a run stopped by SIGSTOP, a debugger or a frozen
 * container holding the trackers' locks; its pid, once stopped. */
static pid_t stopped_holder(int n, const char *const *paths) {
    fflush(NULL);
    pid_t kid = fork();
    if (kid == 0) {
        for (int i = 0; i < n; i++) {
            int fd = open(paths[i], O_RDONLY | O_CLOEXEC);
            if (fd < 0 || flock(fd, LOCK_EX) != 0) _exit(1);
        }
        raise(SIGSTOP);
        _exit(0);
    }
    int ws = 0;
    CHECK(waitpid(kid, &ws, WUNTRACED) == kid && WIFSTOPPED(ws));
    return kid;
}

static void end_holder(pid_t kid) {
    int ws = 0;
    CHECK(kill(kid, SIGKILL) == 0 && waitpid(kid, &ws, 0) == kid);
}

/* The last error is a lock's timeout naming path and the stopped holder (its
 * pid from /proc/locks: Linux; "another process" without it). */
static void check_held_by(pid_t kid, const char *path) {
    char want[64];
    snprintf(want, sizeof want, access("/proc/locks", R_OK) == 0 ? "pid %d (stopped)" : "another process", (int)kid);
    const char *err = accel_last_error();
    CHECK_MSG(accel_last_status() == ACCEL_ERR_TIMEOUT && strstr(err, path) && strstr(err, want) &&
                  strstr(err, "no progress") && strstr(err, "ACCEL_WRITE_STALL_TIMEOUT"),
              "%s", err);
    accel_clear_error();
}

/* A run stopped holding a lock that other runs' trackers take: log.jsonl's
 * (appenders take turns on it) or the run directory's (csv trackers hold it
 * to start and to widen). A blocking flock hung every other run's log there
 * with no word; now the wait goes on while the holder makes progress and
 * fails after ACCEL_WRITE_STALL_TIMEOUT seconds without, ACCEL_ERR_TIMEOUT
 * naming it, nothing written; with the holder gone the same calls go
 * through. A csv row that does not widen takes no lock (log.csv is this
 * run's alone): it is written beside a holder of log.csv and of the
 * directory. */
static void test_stopped_run_holding_locks(void) {
    CHECK(setenv("ACCEL_WRITE_STALL_TIMEOUT", "0.3", 1) == 0);
    char *dir = temp_dir(), run[512], jsonl[530], csv[530];
    snprintf(run, sizeof run, "%s/p", dir);
    snprintf(jsonl, sizeof jsonl, "%s/log.jsonl", run);
    snprintf(csv, sizeof csv, "%s/log.csv", run);
    accel_tracker *j = accel_tracker_open("jsonl", "p", dir), *c = accel_tracker_open("csv", "p", dir);
    CHECK(j && c);
    CHECK(accel_tracker_log(j, 1, A1, 0) == ACCEL_OK && accel_tracker_log(c, 1, A1, 0) == ACCEL_OK);

    pid_t kid = stopped_holder(1, (const char *[]){jsonl});
    CHECK(accel_tracker_log(j, 1, A1, 1) == ACCEL_ERR_TIMEOUT);
    check_held_by(kid, jsonl);
    end_holder(kid);
    CHECK_MSG(accel_tracker_log(j, 1, A1, 2) == ACCEL_OK, "%s", accel_last_error());

    kid = stopped_holder(2, (const char *[]){run, csv});
    CHECK_MSG(accel_tracker_log(c, 1, A1, 1) == ACCEL_OK, "a row of log.csv's width: %s", accel_last_error());
    CHECK(accel_tracker_log(c, 2, AB, 2) == ACCEL_ERR_TIMEOUT); /* a widening */
    CHECK_STR_CONTAINS(accel_last_error(), "csv tracker: cannot rewrite ");
    check_held_by(kid, run);
    CHECK(!accel_tracker_open("csv", "p", dir)); /* another run starting there */
    check_held_by(kid, run);
    end_holder(kid);
    CHECK_MSG(accel_tracker_log(c, 2, AB, 3) == ACCEL_OK, "%s", accel_last_error());
    accel_tracker *c2 = accel_tracker_open("csv", "p", dir); /* c's log.csv moved aside to log.1.csv */
    CHECK_MSG(c2 != NULL, "%s", accel_last_error());
    CHECK(accel_tracker_finish(c2) == ACCEL_OK);
    CHECK(accel_tracker_finish(j) == ACCEL_OK && accel_tracker_finish(c) == ACCEL_OK);
    CHECK(unsetenv("ACCEL_WRITE_STALL_TIMEOUT") == 0);
    char *s = slurp(jsonl);
    CHECK_MSG(s && !strcmp(s, "{\"step\":0,\"a\":1.0}\n{\"step\":2,\"a\":1.0}\n"), "log.jsonl: %s", s);
    free(s);
    snprintf(csv, sizeof csv, "%s/log.1.csv", run);
    s = slurp(csv);
    CHECK_MSG(s && !strcmp(s, "step,a,b\n0,1.0,\n1,1.0,\n3,2.0,3.0\n"), "log.1.csv: %s", s);
    free(s);
    rm_rf(dir);
}

int main(void) {
    RUN(test_tb_long_text_tag);
    RUN(test_hparams_yml_quotes_as_pyyaml);
    RUN(test_hparams_yml_through_writer);
    RUN(test_floats_written_as_python);
    RUN(test_tb_log_after_disk_full);
    RUN(test_text_log_after_disk_full);
    RUN(test_csv_header_first);
    RUN(test_csv_widen_fails_tmp_taken);
    RUN(test_csv_widen_keeps_user_tmp);
    RUN(test_csv_widen_reuses_killed_writers_tmp);
    RUN(test_csv_widen_fails_file_too_large);
    RUN(test_csv_two_runs_one_directory);
    RUN(test_csv_widen_log_gone);
    RUN(test_stopped_run_holding_locks);
    accel_thread_cleanup();
    return check_summary();
}
