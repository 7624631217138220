/* crashentry: a plugin whose entry function dies of SIGSEGV, as a plugin with a bug in its setup
 * code would. Whatever loads it (hvd_init, hvd-info's listing) must survive it or report it: it
 * exists so that tests can check which. */
#include <signal.h>

#include "hvd/backend.h"

HVD_PLUGIN_EXPORT const hvd_backend_v1* hvd_backend_entry_v1(void) {
  raise(SIGSEGV);
  return 0; /* not reached: SIGSEGV's default action ends the process */
}
