"""Many ranks as one: collectives (dist.py, the only caller), bring-up's rules, launching, hostfiles, the launch
environment, the watchdog, stop signals and the queue of work the ranks share. Knows nothing of checkpoints or
training."""
