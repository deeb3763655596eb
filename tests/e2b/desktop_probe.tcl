# A window the desktop tests draw, click and type into (run with `wish`,
# which the desktop template has: x11vnc's own settings window needs it).
#
#   wish desktop_probe.tcl -name probe LOG GEOMETRY COLOUR...
#
# GEOMETRY is Tk's `WxH+X+Y`, or `full` for a full-screen window. The
# window is filled with the first COLOUR (`#rrggbb`); each left click
# paints it the next one (the last stays). Every pointer and key event is
# appended to LOG, one line each, with root coordinates:
#   ready <geometry>           once the window is on the screen
#   press <button> <x> <y>     release <button> <x> <y>
#   motion <x> <y>             (only while button 1 is down)
#   key <keysym> <state> <char as a decimal code point, or ->
# so a test reads what the X server delivered, not what the SDK answered.
lassign $argv log geometry
set colours [lrange $argv 2 end]
set out [open $log a]
fconfigure $out -buffering line

proc note {line} {
    global out
    puts $out $line
}

wm title . "warren probe"
if {$geometry eq "full"} {
    wm attributes . -fullscreen 1
} else {
    wm geometry . $geometry
}
. configure -background [lindex $colours 0] -cursor crosshair
set painted 0

bind . <ButtonPress> {
    note "press %b %X %Y"
    if {%b == 1 && $painted < [llength $colours] - 1} {
        incr painted
        . configure -background [lindex $colours $painted]
    }
}
bind . <ButtonRelease> { note "release %b %X %Y" }
bind . <B1-Motion> { note "motion %X %Y" }
bind . <KeyPress> {
    set c %A
    note "key %K %s [expr {$c eq {} ? {-} : [scan $c %%c]}]"
}

tkwait visibility .
# A full-screen window is resized by the window manager after it is mapped.
while {$geometry eq "full" && [winfo height .] < [winfo screenheight .]} {
    after 50
    update
}
focus -force .
update
note "ready [winfo width .]x[winfo height .]+[winfo rootx .]+[winfo rooty .]"
