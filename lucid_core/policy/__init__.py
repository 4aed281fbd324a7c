"""The decision core shared by the simulator and the live scheduler."""
