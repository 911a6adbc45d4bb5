/* store_composite.c - placeholder (being written). */
#include <errno.h>
#include "eos.h"
#include "selene.h"
int sel_composite_store_open(const sel_store_config *cfg, sel_store **out)
{
	(void)cfg;
	*out = NULL;
	return eos_fail(-ENOTSUP, "composite: not yet");
}
