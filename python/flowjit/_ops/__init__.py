"""The op library under flow.nn, flow.math, flow.layers and the rest: the
builders of IR nodes (builders) and the ops written with them, by family."""
