"""The fault model: each rank's watchdog, the blame for a fault, the requeue policy, and the
supervisor that restarts an attempt inside its allocation (its pure plan and its loop).
"""
