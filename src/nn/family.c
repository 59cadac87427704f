/* The table of model families (family.h) and the generic questions it
 * answers. Adding a family: define its row in its own file, list it here. */
#include "family.h"

static const accel__family *const FAMILIES[] = {&accel__decoder_family, &accel__bert_family};

const accel__family *accel__family_of(const accel_module *m) {
    for (size_t i = 0; m && i < sizeof FAMILIES / sizeof FAMILIES[0]; i++)
        if (FAMILIES[i]->layer_class(m)) return FAMILIES[i];
    return NULL;
}

int accel_module_no_split_classes(const accel_module *m, const char *out[ACCEL_MAX_NO_SPLIT]) {
    for (; m; m = m->parent) {
        const accel__family *f = accel__family_of(m);
        if (!f) continue;
        int n = 0;
        out[n++] = f->layer_class(m);
        if (f->unsplit_class && (out[n] = f->unsplit_class(m))) n++;
        return n;
    }
    return 0;
}

const char *accel_module_decoder_layer_class(const accel_module *m) {
    for (; m; m = m->parent) {
        const accel__family *f = accel__family_of(m);
        if (f) return f->layer_class(m);
    }
    return NULL;
}
