# Warnings applied to every Chorus target (not to third-party code).
set(CHORUS_WARNING_FLAGS -Wall -Wextra -Wno-unused-parameter)
