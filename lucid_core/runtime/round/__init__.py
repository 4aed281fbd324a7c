"""The round room: one scheduling round (view builder, named steps, settings, deadlines, pending words).

May import `store` and `hosts`; never `surfaces`. The policy it runs is `lucid_core.policy`, as in the simulator.
"""
