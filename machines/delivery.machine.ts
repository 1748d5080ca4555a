import { setup } from 'xstate';

// One push delivery: an event of a task on its way to one config's URL. Per config, a delivery is
// attempted only after every earlier one has ended, so a receiver sees events in journal order.

export const DELIVERY_STATES = ['pending', 'delivered', 'dead', 'expired', 'cancelled', 'superseded'] as const;
export type DeliveryState = (typeof DELIVERY_STATES)[number];

export type DeliveryEvent =
  | { type: 'ACKNOWLEDGED' }
  | { type: 'RETRY_LATER' }
  | { type: 'GIVE_UP' }
  | { type: 'DEADLINE_PASSED' }
  | { type: 'CONFIG_GONE' }
  | { type: 'COALESCED' };

export const deliveryMachine = setup({ types: { events: {} as DeliveryEvent } }).createMachine({
  id: 'delivery',
  initial: 'pending',
  states: {
    pending: {
      description: 'Waiting for its turn, its next attempt, or a paused config to resume',
      on: {
        ACKNOWLEDGED: 'delivered',
        RETRY_LATER: 'pending',
        GIVE_UP: 'dead',
        DEADLINE_PASSED: 'expired',
        CONFIG_GONE: 'cancelled',
        COALESCED: 'superseded',
      },
    },
    delivered: { type: 'final', description: 'The receiver answered 2xx' },
    dead: { type: 'final', description: 'Out of attempts, or refused for good' },
    expired: { type: 'final', description: 'Not delivered before its deadline' },
    cancelled: { type: 'final', description: 'Its config was deleted or stopped' },
    superseded: { type: 'final', description: 'Coalesced over the bounds: a newer state of the task replaced it' },
  },
});
