/* The strategy of each ZeRO stage (strategy.h). */
#include "strategy.h"

const accel__strategy *accel__strategy_of(int stage) {
    static const accel__strategy *const BY_STAGE[] = {&accel__strategy_ddp, &accel__strategy_zero1,
                                                      &accel__strategy_zero2, &accel__strategy_zero3};
    ACCEL_ASSERT(stage >= 0 && stage < ACCEL__STAGES);
    return BY_STAGE[stage];
}
