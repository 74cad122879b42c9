# The `docs` target: Doxygen's HTML reference of the public headers, the README as its main page
# and the guides beside it. Internals (namespace detail) stay out of it.
include_guard(GLOBAL)

set(DOXYGEN_PROJECT_NAME "remat")
set(DOXYGEN_PROJECT_BRIEF "Gradient checkpointing done right: a header-only C++20 autograd library")
set(DOXYGEN_OUTPUT_DIRECTORY "${PROJECT_BINARY_DIR}/docs")
set(DOXYGEN_USE_MDFILE_AS_MAINPAGE "${PROJECT_SOURCE_DIR}/README.md")
set(DOXYGEN_STRIP_FROM_PATH "${PROJECT_SOURCE_DIR}")
set(DOXYGEN_STRIP_FROM_INC_PATH "${PROJECT_SOURCE_DIR}/include")
set(DOXYGEN_EXCLUDE_SYMBOLS "detail" "*::detail" "*::detail::*" "REMAT_*")
set(DOXYGEN_JAVADOC_AUTOBRIEF YES)
set(DOXYGEN_EXTRACT_STATIC YES)
set(DOXYGEN_SORT_MEMBER_DOCS NO)  # declaration order: the headers are written to be read top down
set(DOXYGEN_GENERATE_TREEVIEW YES)
set(DOXYGEN_WARN_IF_UNDOCUMENTED NO)
set(DOXYGEN_WARN_LOGFILE "${PROJECT_BINARY_DIR}/docs/warnings.log")
set(DOXYGEN_QUIET YES)
set(DOXYGEN_IMAGE_PATH "${PROJECT_SOURCE_DIR}/docs/figures")
doxygen_add_docs(docs
  "${PROJECT_SOURCE_DIR}/include/remat"
  "${PROJECT_SOURCE_DIR}/README.md"
  "${PROJECT_SOURCE_DIR}/docs/guide.md"
  "${PROJECT_SOURCE_DIR}/docs/design.md"
  "${PROJECT_SOURCE_DIR}/docs/benchmarks.md"
  "${PROJECT_SOURCE_DIR}/docs/distributed.md"
  COMMENT "Doxygen: the API reference in ${PROJECT_BINARY_DIR}/docs/html")
