/* Links from an object to its dependants (link.h). */
#include "core/link.h"

accel_status accel__link_add(accel__link **head, accel__detach_fn detach, void *owner) {
    accel__link *l = accel_malloc(sizeof *l);
    if (!l) return accel_last_status();
    l->detach = detach;
    l->away = NULL;
    l->owner = owner;
    l->observer = false;
    l->next = *head;
    *head = l;
    return ACCEL_OK;
}

accel_status accel__link_observe(accel__link **head, accel__detach_fn detach, void *owner) {
    accel__link *l = accel_malloc(sizeof *l);
    if (!l) return accel_last_status();
    *l = (accel__link){.detach = detach, .owner = owner, .observer = true};
    /* at the tail: told after every binding link, whatever the order they came in (an accelerator
     * un-preparing the model gives a ZeRO optimizer its state back while it is still usable) */
    while (*head) head = &(*head)->next;
    *head = l;
    return ACCEL_OK;
}

bool accel__link_binds(const accel__link *head) {
    for (const accel__link *l = head; l; l = l->next)
        if (!l->observer) return true;
    return false;
}

void accel__link_set_away(accel__link *head, const void *owner, accel__away_fn away) {
    for (accel__link *l = head; l; l = l->next)
        if (l->owner == owner) l->away = away;
}

const char *accel__link_away(const accel__link *head, const void *obj) {
    for (const accel__link *l = head; l; l = l->next) {
        const char *why = l->away ? l->away(l->owner, obj) : NULL;
        if (why) return why;
    }
    return NULL;
}

void accel__link_remove(accel__link **head, const void *owner) {
    for (accel__link **p = head; *p; p = &(*p)->next) {
        if ((*p)->owner != owner) continue;
        accel__link *l = *p;
        *p = l->next;
        accel_free(l);
        return;
    }
}

void *accel__link_owner(const accel__link *head, accel__detach_fn detach) {
    for (const accel__link *l = head; l; l = l->next)
        if (l->detach == detach) return l->owner;
    return NULL;
}

void accel__link_detach_all(accel__link **head, void *obj) {
    while (*head) {
        accel__link *l = *head;
        *head = l->next; /* unlinked first: detach may look at the list */
        l->detach(l->owner, obj);
        accel_free(l);
    }
}
