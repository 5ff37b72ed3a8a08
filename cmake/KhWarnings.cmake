# Warnings for our own targets; -Werror when KH_WERROR is on (CI and make test turn it on).
option(KH_WERROR "treat warnings as errors" OFF)
function(kh_target_defaults target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wshadow -Wstrict-prototypes
    -Wno-unused-parameter -fvisibility=hidden)
  if(KH_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
