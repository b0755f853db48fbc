# An optional part of the build chosen by a cache variable AUTO | ON | OFF.
# parm_optional(VAR REQUIRED): REQUIRED = ON when VAR is ON (missing pieces are then fatal),
# OFF when it is AUTO (missing pieces leave the part out); for OFF it returns from the file
# that calls it (a macro's return() leaves its caller), so nothing after it is configured.
macro(parm_optional var required)
  if(${var} STREQUAL "AUTO")
    set(${required} OFF)
  elseif(${var})
    set(${required} ON)
  else()
    return()
  endif()
endmacro()
