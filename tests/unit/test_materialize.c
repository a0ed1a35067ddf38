#include "autoconf.h"
#include "suites.h"
Suite *materialize_suite(void)
{
	return suite_create("materialize");
}
