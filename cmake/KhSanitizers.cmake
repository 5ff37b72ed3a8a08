# KH_SANITIZE=address,undefined builds everything with those sanitizers (make test does).
set(KH_SANITIZE "" CACHE STRING "comma-separated -fsanitize= list, e.g. address,undefined")
if(KH_SANITIZE)
  add_compile_options(-fsanitize=${KH_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=${KH_SANITIZE})
endif()

# kh_unsanitized(<target>): builds target without the KH_SANITIZE instrumentation. For the test
# clients the specs spawn per request (kh-h3get): under ASan+UBSan one run costs about 2.5x the
# CPU and wall time of a plain one, most of it the sanitizer runtime's start-up, and what the
# specs check is the server's behaviour (the server stays sanitized), not the client's.
function(kh_unsanitized target)
  if(NOT KH_SANITIZE)
    return()
  endif()
  foreach(prop COMPILE_OPTIONS LINK_OPTIONS)
    get_target_property(opts ${target} ${prop})
    if(opts)
      list(REMOVE_ITEM opts -fsanitize=${KH_SANITIZE} -fno-sanitize-recover=undefined)
      set_target_properties(${target} PROPERTIES ${prop} "${opts}")
    endif()
  endforeach()
endfunction()
