/* Links from an object to those that depend on it (internal). A model an
 * accelerator prepared or a dispatch hooked, an optimizer, a data loader or a
 * scheduler an accelerator holds: each keeps a list of links, and freeing it
 * first calls every link's detach, so the dependant lets go while the object
 * is still whole (docs/contract.md "Lifetimes"). The dependant removes its
 * link when it is freed first. */
#ifndef ACCEL_CORE_LINK_H
#define ACCEL_CORE_LINK_H

#include "accel/core.h"

typedef void (*accel__detach_fn)(void *owner, void *obj);
/* Why obj's tensors do not hold its whole values while owner holds it (a
 * sentence for an error: "its parameters are sharded across processes
 * ..."), or NULL when they do. */
typedef const char *(*accel__away_fn)(void *owner, const void *obj);

typedef struct accel__link {
    accel__detach_fn detach;
    accel__away_fn away; /* NULL: the owner never takes the values away */
    void *owner;
    bool observer; /* the owner only needs to know when the object goes (accel__link_observe) */
    struct accel__link *next;
} accel__link;

/* Adds owner's link (NULL + error on OOM). */
accel_status accel__link_add(accel__link **head, accel__detach_fn detach, void *owner);
/* Adds owner's link as an observer's: told of the object's free like any
 * link, after every binding link (it goes at the tail), but not one that ties the object (accel__link_binds: an optimizer
 * over a model, which the model's tensor-parallel cut may precede). */
accel_status accel__link_observe(accel__link **head, accel__detach_fn detach, void *owner);
/* Whether a link other than an observer's ties the object (an accelerator
 * that prepared it, a dispatch, flat buffers). */
bool accel__link_binds(const accel__link *head);
/* Gives owner's link (made with accel__link_add) the question away. */
void accel__link_set_away(accel__link *head, const void *owner, accel__away_fn away);
/* The first owner's answer why obj's values are away (a lower layer saving
 * or exporting obj asks, knowing nothing of the owners), or NULL. */
const char *accel__link_away(const accel__link *head, const void *obj);
/* Removes owner's link; no-op when it has none. */
void accel__link_remove(accel__link **head, const void *owner);
/* The owner of the first link made with detach, or NULL. */
void *accel__link_owner(const accel__link *head, accel__detach_fn detach);
/* The object is going away: unlinks and calls every detach(owner, obj), the
 * newest binding link first (a dependant made later, e.g. an accelerator over the flat
 * buffers it made, lets go before what it was built on), the observers last. */
void accel__link_detach_all(accel__link **head, void *obj);

#endif
