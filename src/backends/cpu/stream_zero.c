/* accel__cpu_zero_streamed: zeros that are next read long after they are
 * written (the gradients between an optimizer step and the next backward,
 * accel__zero_cold_), stored around the caches. memset's ordinary stores
 * first read every line from memory (glibc streams only past a threshold
 * derived from the last-level cache, which a VM may report as hundreds of
 * MB): for the bf16 Llama step's 142 MB of gradients on the AMX Xeon,
 * zero_grad took ~14 ms a step, streamed ~7 ms less (docs/cpu.md "The
 * gradients' zeros, streamed"). SSE2's 16-byte streaming stores are x86-64's baseline; the
 * unaligned head and tail, and other machines, use memset. */
#include <stdint.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "cpu_kernels.h"

void accel__cpu_zero_streamed(void *p, size_t n) {
    if (!n) return; /* p may be NULL then (an empty tensor's) */
    char *c = p;
#ifdef __SSE2__
    size_t head = (size_t)(-(uintptr_t)c % 16);
    if (n >= head + 64) {
        memset(c, 0, head);
        c += head, n -= head;
        const __m128i z = _mm_setzero_si128();
        size_t body = n & ~(size_t)15;
        for (size_t i = 0; i < body; i += 16) _mm_stream_si128((__m128i *)(void *)(c + i), z);
        _mm_sfence(); /* the streamed zeros are visible to other threads' loads after this */
        c += body, n -= body;
    }
#endif
    memset(c, 0, n);
}
