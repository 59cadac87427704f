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

/* No allocation, however long the number (an allocator that refuses every
 * one is installed): a long number's copy was on the heap, and an out of
 * memory there was reported by the callers as "not a number". */
static void test_no_allocation(void) {
    static char text[20001];
    text[0] = '1';
    for (int i = 0; i < 100; i++) memcpy(text + 1 + 2 * i, "_0", 2); /* 201 characters */
    text[201] = 0;
    refuse_band all = {.min = 0, .max = SIZE_MAX};
    refuse_band_install(&all);
    double v = 0, w = 0;
    bool ok = accel__python_float(text, &v);
    memset(text, '0', 20000); /* 20000 characters: 0.(300 zeros)25(19698 zeros) */
    memcpy(text, "0.", 2);
    memcpy(text + 302, "25", 2);
    text[20000] = 0;
    bool ok2 = accel__python_float(text, &w);
    refuse_band_install(NULL);
    CHECK_MSG(ok && v == 1e100 && ok2 && w == strtod("2.5e-301", NULL) && !all.refused, "%a %a refused %d", v, w,
              (int)all.refused);
}

/* Long numbers as strtod reads the same digits: past 800 significant digits
 * the rest only round, and one nonzero among them still rounds up a halfway
 * case (2^53 + 1 is halfway between two doubles: ties go to the even one). */
static void test_long_rounding(void) {
    static char text[4096];
    char *d;
    double v = 0;
    /* 9007199254740993.000...0001: just above the halfway point */
    snprintf(text, sizeof text, "9007199254740993.");
    size_t n = strlen(text);
    memset(text + n, '0', 1500);
    snprintf(text + n + 1500, sizeof text - n - 1500, "1");
    CHECK_MSG(accel__python_float(text, &v) && v == 9007199254740994.0, "above halfway: %a", v);
    text[n + 1500] = 0; /* exactly halfway: the even one */
    CHECK_MSG(accel__python_float(text, &v) && v == 9007199254740992.0, "halfway: %a", v);
    /* 2.5 x 2^-1074, halfway between the two subnormals 2 and 3 x 2^-1074: 5^1076 / 10^1075, whose 753
     * significant digits all count (ties to the even 2); any nonzero digit after them, however far,
     * makes it 3 */
    char digits[800];
    int nd = 1;
    digits[0] = 1; /* 5^1076, least significant digit first */
    for (int k = 0; k < 1076; k++) {
        int carry = 0;
        for (int i = 0; i < nd; i++) {
            int x = digits[i] * 5 + carry;
            digits[i] = (char)(x % 10), carry = x / 10;
        }
        if (carry) digits[nd++] = (char)carry;
    }
    d = text;
    d += sprintf(d, "0.");
    for (int i = 0; i < 1075 - nd; i++) *d++ = '0';
    for (int i = nd - 1; i >= 0; i--) *d++ = (char)('0' + digits[i]);
    *d = 0;
    CHECK_MSG(accel__python_float(text, &v) && v == ldexp(2, -1074), "the subnormals' halfway point: %a", v);
    memset(d, '0', 100);
    snprintf(d + 100, (size_t)(text + sizeof text - d - 100), "1");
    CHECK_MSG(accel__python_float(text, &v) && v == ldexp(3, -1074), "above the subnormals' halfway point: %a", v);
    /* an exponent of any length: past 10^17 the value is 0 or infinite either way */
    CHECK(accel__python_float("1e99999999999999999999999999", &v) && v == INFINITY);
    CHECK(accel__python_float("-1e99_999_999_999_999_999_999_999", &v) && v == -INFINITY);
    CHECK(accel__python_float("1e-99999999999999999999999999", &v) && v == 0);
    CHECK(accel__python_float("0e99999999999999999999999999", &v) && v == 0);
    /* random digits of every length around 800, a point and an exponent, against strtod */
    unsigned seed = 12345;
    for (int t = 0; t < 400; t++) {
        size_t len = 700 + (size_t)(t % 200) + (t >= 200 ? 1000 : 0), point = (seed = seed * 1103515245 + 12345) % len;
        d = text;
        for (size_t i = 0; i < len; i++) {
            if (i == point) *d++ = '.';
            *d++ = (char)('0' + (seed = seed * 1103515245 + 12345) / 65536 % 10);
        }
        snprintf(d, (size_t)(text + sizeof text - d), "e%d", (int)((seed = seed * 1103515245 + 12345) / 65536 % 1400) - 1000);
        double want = strtod(text, NULL);
        CHECK_MSG(accel__python_float(text, &v) && !memcmp(&v, &want, sizeof v), "%.40s...: %a, strtod %a", text, v,
                  want);
    }
}

int main(void) {
    RUN(test_table);
    RUN(test_long);
    RUN(test_bounded);
    RUN(test_no_allocation);
    RUN(test_long_rounding);
    return check_summary();
}
