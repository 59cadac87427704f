/* accel__python_float (src/core/env.c) against Python's float() itself: the
 * table below is tools/gen_python_float_table.py's output, python3's verdict
 * and value (exact bits, as a hex literal) for each text. Every number
 * setting accel reads from the environment or from a launcher flag goes
 * through the parser, so these are their rules: blanks around the text and
 * '_' between two digits are taken, hex and C's "nan(...)" are not (strtod
 * took them: ACCEL_GRADIENT_CLIPPING=0x10 clipped at 16). */
#include <stdbool.h>
#include <stdint.h>

#include "check.h"
#include "core/env.h"
#include "refuse_band.h"

typedef struct row {
    const char *text;
    bool ok;
    double value;
} row;

static const row TABLE[] = {
    {"1_0", true, 0x1.4000000000000p+3},
    {"_1", false, 0},
    {"1__0", false, 0},
    {"1_", false, 0},
    {"1_000.000_1", true, 0x1.f4000346dc5d6p+9},
    {"0_0", true, 0x0.0p+0},
    {"1e1_0", true, 0x1.2a05f20000000p+33},
    {"1_e1", false, 0},
    {"1e_1", false, 0},
    {"1e+_1", false, 0},
    {"1_.5", false, 0},
    {"1._5", false, 0},
    {"+_1", false, 0},
    {" 1", true, 0x1.0000000000000p+0},
    {"1 ", true, 0x1.0000000000000p+0},
    {"\t1\n", true, 0x1.0000000000000p+0},
    {"\v1\f\r", true, 0x1.0000000000000p+0},
    {" 1 1", false, 0},
    {"- 1", false, 0},
    {"\0341", false, 0},
    {"1\037", false, 0},
    {"+inf", true, INFINITY},
    {"-Infinity", true, -INFINITY},
    {"nan", true, NAN},
    {"infinity", true, INFINITY},
    {"iNf", true, INFINITY},
    {"nAn", true, NAN},
    {"-nan", true, NAN},
    {"+infinity", true, INFINITY},
    {" -Infinity\t", true, -INFINITY},
    {"inf ", true, INFINITY},
    {"infinit", false, 0},
    {"in", false, 0},
    {"infinityy", false, 0},
    {"0x10", false, 0},
    {"0x1p3", false, 0},
    {"nan(1)", false, 0},
    {"0X1P-2", false, 0},
    {"1,5", false, 0},
    {"1e3", true, 0x1.f400000000000p+9},
    {"1.e3", true, 0x1.f400000000000p+9},
    {".5", true, 0x1.0000000000000p-1},
    {"5.", true, 0x1.4000000000000p+2},
    {"-.5", true, -0x1.0000000000000p-1},
    {"+.5e+2", true, 0x1.9000000000000p+5},
    {"1.5e-3", true, 0x1.89374bc6a7efap-10},
    {"00", true, 0x0.0p+0},
    {"007.5", true, 0x1.e000000000000p+2},
    {"1E5", true, 0x1.86a0000000000p+16},
    {"1e400", true, INFINITY},
    {"-1e400", true, -INFINITY},
    {"1e-400", true, 0x0.0p+0},
    {"4.9e-324", true, 0x0.0000000000001p-1022},
    {"0.1", true, 0x1.999999999999ap-4},
    {"123456789012345678901234567890", true, 0x1.8ee90ff6c373ep+96},
    {"2.5", true, 0x1.4000000000000p+1},
    {"-0", true, -0x0.0p+0},
    {"", false, 0},
    {" ", false, 0},
    {"1e", false, 0},
    {"e3", false, 0},
    {"1d", false, 0},
    {".", false, 0},
    {"+", false, 0},
    {"-", false, 0},
    {"..5", false, 0},
    {"1..", false, 0},
    {"5.5.5", false, 0},
    {"+-1", false, 0},
    {"1e+", false, 0},
    {"1e3.5", false, 0},
    {".e3", false, 0},
    {"1f", false, 0},
};

static bool same(double a, double b) { return (isnan(a) && isnan(b)) || !memcmp(&a, &b, sizeof a); }

static void test_table(void) {
    for (size_t i = 0; i < sizeof TABLE / sizeof *TABLE; i++) {
        double v = 12345;
        bool ok = accel__python_float(TABLE[i].text, &v);
        CHECK_MSG(ok == TABLE[i].ok && same(v, ok ? TABLE[i].value : 12345), "'%s': %s, %a (Python: %s, %a)",
                  TABLE[i].text, ok ? "taken" : "refused", v, TABLE[i].ok ? "taken" : "refused", TABLE[i].value);
    }
}

/* Texts of any length, as float() takes them (a fixed buffer refused
 * them): 400 digits, and 1 with 300 '_0' (the '_' dropped: 1e300). */
static void test_long(void) {
    char text[1024];
    memset(text, '0', 400);
    snprintf(text + 400, sizeof text - 400, "1.5 ");
    double v = 0;
    CHECK_MSG(accel__python_float(text, &v) && v == 1.5, "%a", v);
    text[0] = '1';
    for (int i = 0; i < 300; i++) memcpy(text + 1 + 2 * i, "_0", 2);
    text[601] = 0;
    CHECK_MSG(accel__python_float(text, &v) && v == 1e300, "%a", v);
    text[600] = '_'; /* a trailing '_' */
    CHECK(!accel__python_float(text, &v));
}

/* accel__python_float_n reads len bytes, whatever follows them (size.c's number before its unit, a chat
 * template's string). */
static void test_bounded(void) {
    double v = 0;
    CHECK_MSG(accel__python_float_n("12345", 2, &v) && v == 12, "%a", v);
    CHECK_MSG(accel__python_float_n("1_0_0", 3, &v) && v == 10, "%a", v);
    CHECK_MSG(accel__python_float_n(" 5 e3", 3, &v) && v == 5, "%a", v);
    CHECK_MSG(accel__python_float_n("2e3", 2, &v) == false && v == 5, "%a", v);
    CHECK_MSG(accel__python_float_n("1_0", 2, &v) == false && v == 5, "%a", v);
    CHECK(!accel__python_float_n("", 0, &v));
}

/* The copy without the '_' on the stack up to 127 characters, on the heap past them: out of memory
 * there is ACCEL_ERR_OOM, not a number refused in silence. */
static void test_out_of_memory(void) {
    char text[256];
    text[0] = '1';
    for (int i = 0; i < 60; i++) memcpy(text + 1 + 2 * i, "_0", 2); /* 121 characters */
    text[121] = 0;
    refuse_band none = {.min = 0, .max = SIZE_MAX};
    refuse_band_install(&none);
    double v = 0;
    bool ok = accel__python_float(text, &v);
    refuse_band_install(NULL);
    CHECK_MSG(ok && v == 1e60 && !none.refused, "%a", v);
    for (int i = 60; i < 100; i++) memcpy(text + 1 + 2 * i, "_0", 2); /* 201 */
    text[201] = 0;
    none.refused = false;
    refuse_band_install(&none);
    accel_clear_error();
    ok = accel__python_float(text, &v);
    refuse_band_install(NULL);
    CHECK(!ok && none.refused && accel_last_status() == ACCEL_ERR_OOM);
    accel_clear_error();
    CHECK_MSG(accel__python_float(text, &v) && v == 1e100, "%a", v);
}

int main(void) {
    RUN(test_table);
    RUN(test_long);
    RUN(test_bounded);
    RUN(test_out_of_memory);
    return check_summary();
}
