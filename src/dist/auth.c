/* src/dist/auth.c — HMAC-SHA256 challenge-response helpers (see auth.h). */
#include "dist/auth.h"

#include <errno.h>
#include <nettle/hmac.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>

void accel__hmac_sha256(const void *key, size_t key_len, const void *const *parts, const size_t *lens, int n,
                        uint8_t out[ACCEL__MAC_LEN]) {
    struct hmac_sha256_ctx ctx;
    hmac_sha256_set_key(&ctx, key_len, key);
    for (int i = 0; i < n; i++)
        if (lens[i]) hmac_sha256_update(&ctx, lens[i], parts[i]);
    hmac_sha256_digest(&ctx, ACCEL__MAC_LEN, out);
    memset(&ctx, 0, sizeof ctx); /* the keyed state */
}

bool accel__auth_nonce(uint8_t out[ACCEL__NONCE_LEN]) {
    size_t got = 0;
    while (got < ACCEL__NONCE_LEN) {
        ssize_t r = getrandom(out + got, ACCEL__NONCE_LEN - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        got += (size_t)r;
    }
    return true;
}

bool accel__auth_challenge(int fd, const char *magic, uint8_t nonce[ACCEL__NONCE_LEN]) {
    uint8_t challenge[ACCEL__CHALLENGE_LEN];
    if (!accel__auth_nonce(nonce)) return false;
    memcpy(challenge, magic, 4);
    memcpy(challenge + 4, nonce, ACCEL__NONCE_LEN);
    return send(fd, challenge, sizeof challenge, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)sizeof challenge;
}

void accel__auth_mac(const char *secret, const char *label, const uint8_t first[ACCEL__NONCE_LEN],
                     const uint8_t second[ACCEL__NONCE_LEN], const void *body, size_t len,
                     uint8_t out[ACCEL__MAC_LEN]) {
    /* The label's terminating zero separates it from the nonces. */
    const void *parts[] = {label, first, second, body};
    const size_t lens[] = {strlen(label) + 1, ACCEL__NONCE_LEN, ACCEL__NONCE_LEN, len};
    accel__hmac_sha256(secret, strlen(secret), parts, lens, 4, out);
}

bool accel__auth_mac_equal(const uint8_t *got, const uint8_t *want) {
    uint8_t diff = 0;
    for (int i = 0; i < ACCEL__MAC_LEN; i++) diff |= got[i] ^ want[i]; /* no early exit: no timing hint */
    return diff == 0;
}
