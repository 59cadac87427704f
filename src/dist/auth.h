/* src/dist/auth.h — proof of the job secret without sending it (internal to dist/).
 *
 * Every connection to the store and to a worker's port is authenticated by a
 * challenge-response: the listening side sends a fresh random nonce first;
 * the connecting side answers with its own nonce and
 *   HMAC-SHA256(secret, label || ns || nc || body)
 * over what it sends; the listener checks it and, where the connector waits
 * for an answer, proves the secret back with another label. Nonces are never
 * reused, so a captured exchange cannot be replayed and the secret never
 * crosses the network. Labels keep one role's MAC from serving as another's.
 * HMAC-SHA256 is nettle's (Debian nettle-dev). docs/dist.md states the wire
 * format. */
#ifndef ACCEL_DIST_AUTH_H
#define ACCEL_DIST_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ACCEL__NONCE_LEN 16
#define ACCEL__MAC_LEN 32
#define ACCEL__CHALLENGE_LEN (4 + ACCEL__NONCE_LEN) /* magic, nonce: what a listener sends first */

/* Raw HMAC-SHA256 of the concatenation of n parts (parts[i], lens[i]). */
void accel__hmac_sha256(const void *key, size_t key_len, const void *const *parts, const size_t *lens, int n,
                        uint8_t out[ACCEL__MAC_LEN]);

/* A fresh nonce from getrandom(); false (errno set) if the kernel gave none. */
bool accel__auth_nonce(uint8_t out[ACCEL__NONCE_LEN]);

/* The listener's first move on a just-accepted socket: draws a nonce into
 * `nonce` and sends magic (4 bytes) and the nonce without blocking (they fit
 * an empty socket buffer). False when either failed: drop the connection. */
bool accel__auth_challenge(int fd, const char *magic, uint8_t nonce[ACCEL__NONCE_LEN]);

/* HMAC-SHA256(secret, label || first || second || body): label is a string
 * naming the message's role, first and second are the two nonces in the
 * order the role prescribes, body (len bytes, may be NULL when 0) is what the
 * message carries. */
void accel__auth_mac(const char *secret, const char *label, const uint8_t first[ACCEL__NONCE_LEN],
                     const uint8_t second[ACCEL__NONCE_LEN], const void *body, size_t len,
                     uint8_t out[ACCEL__MAC_LEN]);

/* Whether a received MAC equals the expected one, in time independent of where they differ. */
bool accel__auth_mac_equal(const uint8_t *got, const uint8_t *want);

#endif
