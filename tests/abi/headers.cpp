// Every public header compiles as C++ with -pedantic-errors (layout.c proves it for C99); built as
// part of the tests, so a header that stops compiling fails the build.
#include "hvd/backend.h"
#include "hvd/hvd.h"
#include "hvd/hvd.hpp"
#include "hvd/reduce.h"
#include "hvd/sdk/backend.hpp"
#include "hvd/sdk/env.hpp"
#include "hvd/sdk/result.hpp"
#include "hvd/types.h"
