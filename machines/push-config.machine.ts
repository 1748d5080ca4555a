import { setup } from 'xstate';

// A push notification config's delivery state. Deletion is separate (deleted_at): a deleted config
// starts no new attempt whatever its state.

export const PUSH_CONFIG_STATES = ['active', 'paused', 'stopped'] as const;
export type PushConfigState = (typeof PUSH_CONFIG_STATES)[number];

export type PushConfigEvent = { type: 'AUTH_FAILED' } | { type: 'RESUME' } | { type: 'STOP' };

export const pushConfigMachine = setup({ types: { events: {} as PushConfigEvent } }).createMachine({
  id: 'pushConfig',
  initial: 'active',
  states: {
    active: {
      description: 'Deliveries are attempted in order',
      on: { AUTH_FAILED: 'paused', STOP: 'stopped' },
    },
    paused: {
      description: 'The receiver answered 401/403 ("authentication failed"); deliveries wait for an operator',
      on: { RESUME: 'active', STOP: 'stopped' },
    },
    stopped: {
      type: 'final',
      description: 'The target is gone (404/410) or refused by the address guard; pending deliveries are cancelled',
    },
  },
});
